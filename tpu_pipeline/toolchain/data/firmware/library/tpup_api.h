/* tpu-pipeline's drop-in model libraries: what every model's C API shares (export-mcu --library).
   One copy serves every model library of an application (the include guard). */
#ifndef TPUP_API_H_
#define TPUP_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes of tpup_<model>_*() */
#define TPUP_OK 0
#define TPUP_ERR_ARENA_ALIGN (-1)   /* an arena not 16-byte aligned */
#define TPUP_ERR_ARENA_SIZE (-2)    /* smaller than TPUP_<MODEL>_ARENA_BYTES */
#define TPUP_ERR_OPS (-3)           /* the op resolver could not register an op */
#define TPUP_ERR_MODEL (-4)         /* the model's schema version is not this TFLite Micro's */
#define TPUP_ERR_ALLOCATE (-5)      /* TFLite Micro's AllocateTensors failed (its log says why) */
#define TPUP_ERR_NOT_READY (-6)     /* init has not succeeded */
#define TPUP_ERR_INDEX (-7)         /* no such input or output */
#define TPUP_ERR_INVOKE (-8)        /* Invoke failed */

#define TPUP_MAX_DIMS 6

/* A model input or output: where it is and how to read it (TfLiteType codes: 9 int8, 3 uint8,
   1 float32, 7 int16, 2 int32). Per-tensor quantization: real = scale * (q - zero_point). */
typedef struct tpup_tensor {
  void* data;
  size_t bytes;
  int type;
  int dims;
  int shape[TPUP_MAX_DIMS];
  float scale;
  int32_t zero_point;
} tpup_tensor;

#ifdef __cplusplus
}
#endif

#endif /* TPUP_API_H_ */
