"""flux-cluster forecast: time-to-train and cost at any GPU count from a small measurement (see model.py
for the model, points.py for the rows, render.py for the formats)."""
