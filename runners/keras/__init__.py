"""What the Keras runners share across backends: the Keras 2 tower machinery (towers.py), the
Keras Sequence/PyDataset input (data.py), the PyDataset pipeline mode and Keras-CNTK."""
