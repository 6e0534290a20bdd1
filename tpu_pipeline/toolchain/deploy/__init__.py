"""Deploying into the user's own firmware: a model as a drop-in TFLite Micro library (`library`)."""
