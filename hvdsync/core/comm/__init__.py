"""Communication maths: gradient codecs and their state, the reducer's rounds (collectives injected), sync modes
(parameter server, local SGD, gossip), sparse gradients and the byte formulas of each pattern."""
