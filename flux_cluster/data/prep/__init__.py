"""Data preparation: the stages of prepare-data (download, convert, index, verify), data encode (a folder of
captioned images through the FLUX encoders), synthetic data, and the logic of those commands."""
