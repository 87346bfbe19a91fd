"""MXNet family (the mxnet environment): native MXNet Module/Gluon, Keras-MXNet, their data
helpers and the ImageRecordIter pipeline mode."""
