"""The NCCL transport (GPU to GPU through vLLM's NCCL pieces): the learner's data plane (`plane`) and the
worker end inside each vLLM engine (`engine`, which reuses the gloo engine's control-plane half). Imports
the shared protocol and `weightsync.gloo.engine`; nothing imports it but the backend table's names."""
