"""ModelShape.parameters (pure arithmetic, what the forecast counts collectives with) equals the
parameters of the diffusers model the training builds, for every model preset."""

import pytest

from flux_cluster.config.workload import load_workload
from flux_cluster.training.memory import parameter_counts


@pytest.mark.parametrize("name", ["flux-schnell", "small", "tiny"])
def test_the_shapes_parameter_count_is_the_models(name: str) -> None:
    args = load_workload("flux1")[0].models[name]
    counts = parameter_counts(args)  # a meta-device model of one block of each kind
    built = args.num_layers * counts.double + args.num_single_layers * counts.single + counts.root
    assert args.shape().parameters == built
