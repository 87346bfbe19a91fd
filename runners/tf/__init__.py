"""TensorFlow family (the tf environment): tf.distribute, graph-mode TF 1.x styles, the Keras 2
tower strategies of 2017 (on tf_keras), tensorpack and tf_cnn_benchmarks; their device and data
helpers and the tf.data pipeline mode."""
