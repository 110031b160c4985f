"""Training data: the read side (format: the Energon sample layout; loader: what training reads) here, and
its preparation (MLCommons cc12m/coco preprocessed data or a folder of captioned images -> Energon
webdatasets) in flux_cluster.data.prep."""
