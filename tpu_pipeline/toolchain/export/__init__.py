"""export-mcu as a stage list (stages/) on the pass driver: a model and its harness project for
TFLite Micro firmware. `params` (ExportParams), `state` (ExportState), `result` (ExportResult,
export.json), `sources` (the C array, op resolver and harness_config.h)."""
