"""The shared training loop and its data: the loop over steps and callbacks, the shard plan (sharding, shares), the
loader, learning-rate and loss scaling, seeding, precision policies and the worker's Horovod knobs."""
