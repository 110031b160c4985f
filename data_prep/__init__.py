"""Data preparation (cc12m/coco -> Megatron-Energon webdatasets); arrives with the prepare-data issue."""
