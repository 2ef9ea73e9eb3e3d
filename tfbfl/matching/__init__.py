"""PFNM neuron matching in pure numpy/scipy (Yurochkin et al., ICML 2019).

* `pfnm`        single hidden layer: eq. (9) costs, Hungarian matching, Prop. 1.
* `multilayer`  top-down matching of every hidden layer (supplement Algorithm 1).
* `streaming`   posterior of step s is the prior of step s+1 (supplement eqs. 10-11).
* `dpmeans`     DP-means clustering of neurons (baseline).

Inputs are lists of per-client numpy weight matrices, so TFF clients and absl
launchers can call these functions directly on trained Keras weights.
"""

from tfbfl.matching.dpmeans import dp_means, dpmeans_single_layer
from tfbfl.matching.multilayer import multilayer_atoms, patch_outgoing, pfnm_multilayer
from tfbfl.matching.single_layer import (MatchingHyperparams, MatchResult, assignment_cost,
                                 class_frequency_weights, coordinate_blocks, existing_neuron_gain,
                                 group_popularity_log_odds, match_layer, new_neuron_gain,
                                 new_neuron_log_prior, num_new_columns, pfnm_single_layer,
                                 popularity_log_odds, single_layer_atoms, softmax_bias_posterior,
                                 split_single_layer_atoms)
from tfbfl.matching.streaming import StreamingPFNM, StreamingState

__all__ = [
    "MatchingHyperparams",
    "MatchResult",
    "match_layer",
    "pfnm_single_layer",
    "pfnm_multilayer",
    "StreamingPFNM",
    "StreamingState",
    "dp_means",
    "dpmeans_single_layer",
    "assignment_cost",
    "coordinate_blocks",
    "existing_neuron_gain",
    "new_neuron_gain",
    "popularity_log_odds",
    "group_popularity_log_odds",
    "new_neuron_log_prior",
    "num_new_columns",
    "single_layer_atoms",
    "split_single_layer_atoms",
    "class_frequency_weights",
    "softmax_bias_posterior",
    "multilayer_atoms",
    "patch_outgoing",
]
