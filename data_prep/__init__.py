"""Data preparation: MLCommons cc12m/coco preprocessed data -> Energon webdatasets, and their loader."""
