"""The hf workload on the rank side: any Hugging Face model from a local folder (text classification,
causal LM, image classification) fine-tuned with DDP, DataParallel or FSDP, fp32 or AMP, all weights or
LoRA, measured as seed 002 measures it. Entry: flux_cluster.hf.train.train (from flux_cluster.jobs.train)."""
