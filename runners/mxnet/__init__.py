"""MXNet family (the mxnet environment): mxnet_native, keras_mxnet, their data and probes."""
