"""TensorFlow family (the tf environment): tf.distribute, the Keras 2 tower strategies of 2017,
tensorpack and tf_cnn_benchmarks; their device and data helpers and the tf.data pipeline mode."""
