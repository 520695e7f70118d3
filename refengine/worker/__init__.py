"""The worker: the model runner that turns a SchedulerOutput into sampled tokens, its persistent input batch, CUDA
graphs, and the device an engine runs on."""
