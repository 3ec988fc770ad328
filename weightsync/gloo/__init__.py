"""The gloo transport (CPU, TCP; what CI runs): the learner's data plane (`plane`), the gloo group and its
bucket framing (`group`), the vLLM weight-transfer engine that receives it inside each engine (`engine`),
and a receiver without vLLM for tests and benchmarks (`plain_receiver`). Imports the shared protocol
(`weightsync.protocol`, `packing`, `liveness`, `delta`, `plane`), never the NCCL transport."""
