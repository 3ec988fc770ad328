"""`run_graph`: the one function that wires the whole process graph. Read it and you have read the
architecture:

    driver (this process) ──pull_batch──► buffer service (own process, ZMQ, msgpack)
       │                                     ▲ push_group / credit
       ├─ step(groups) ──► learner ranks (Ray actors, FSDP2 over gloo/NCCL)
       │                     │ rank 0: WeightSender ──gloo/NCCL──► every actor engine
       └─ evaluate ──────► rollout actors (Ray actors, one vLLM AsyncLLM each)

Actors generate continuously from their prompt shards, asking the buffer for credit first (so
`max_staleness` holds by admission); the driver pulls whole groups, has the learner ranks take one
optimiser step, starts pushing the new weights to every engine (generation pauses only while weights
load; the push travels while the learner pulls and trains the next batch), then tells the buffer the
new version. `--serial` runs the learner and the actors as
plain objects in this process, without Ray (the buffer service and vLLM's engine cores stay
subprocesses), for debugging with ordinary tools.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import algos
from configs.schema import RunConfig
from launch.loop.driver import Driver
from launch.loop.progress import Progress


def run_graph(cfg: RunConfig, run_dir: Path, progress: Progress) -> int:
    from actors.prompts import load_tokenizer
    from buffer.auth import RunSecrets
    from launch.planning.cluster import init_ray, joins_cluster
    from launch.planning.placement import plan_rank_cores
    from launch.prep.data import load_run_data
    from launch.prep.model_prep import prepare_model
    from launch.processes.process_graph import ProcessGraph
    from launch.state.buffer_keeper import BufferKeeper
    from launch.state.storage import check_shared_storage, other_nodes, shared_paths

    def load_inputs():  # the warm model, then the prompts (and demonstrations) tokenized with its tokenizer
        model_dir = prepare_model(cfg, log=progress.message)
        return model_dir, load_run_data(cfg, load_tokenizer(str(model_dir), cfg.model.trust_remote_code), run_dir,
                                        need_demos=algos.get(cfg.algo).needs_demonstrations, log=progress.message)

    with ThreadPoolExecutor(1, thread_name_prefix="run-inputs") as pool:
        inputs = pool.submit(load_inputs)  # seconds of one core each (imports): they overlap Ray's start
        if not cfg.serial:
            init_ray(cfg)
        model_dir, data = inputs.result()
    secrets = RunSecrets.generate()  # this run's keys: handed to its processes, never written anywhere
    cluster = joins_cluster(cfg)  # else loopback: one machine
    graph = ProcessGraph(cfg, model_dir, data, secrets=secrets.public(), log=progress.message,
                         log_dir=None if cfg.logging.verbose else run_dir / "logs")
    keeper = teacher = scorer = None
    try:
        if not cfg.serial:  # every other node sees the run folder, the model and the data, or the run stops here
            check_shared_storage(run_dir, other_nodes(), shared_paths(cfg, model_dir))
        # the buffer is the driver's child: on a cluster it listens on the driver's node and advertises its IP
        keeper = BufferKeeper(cfg, run_dir, advertise_host=graph.node_ip() if cluster else None, secrets=secrets)
        graph.buffer_address = keeper.start()
        progress.message(f"[graph] buffer at {graph.buffer_address} (CURVE: only this run's key pair is served)")
        # one CPU machine: learner ranks on cores of their own; the actors on any core (`launch.planning.placement`)
        # (--serial: the learner is this process, whose threads also run the actors' loops: not pinned)
        one_cpu_machine = (not cluster and not cfg.serial and cfg.rollout.gpus_per_actor == 0
                           and cfg.learner.gpus_per_rank == 0)
        rank_cores = (plan_rank_cores(cfg.learner.world_size, cfg.learner.cpus_per_rank) if one_cpu_machine
                      else [None] * cfg.learner.world_size)
        devices = graph.teacher_devices()  # the GPUs Ray holds for each teacher engine (in this process)
        if cfg.teacher.live_traces != "off":  # its own engine, on its own thread, starting now: nobody waits for it
            from launch.processes.teacher_role import LiveTeacher

            teacher = LiveTeacher(cfg, cfg.teacher.path, data, run_dir, log=progress.message, devices=devices.pop(0))
            teacher.start()
        if cfg.teacher.scoring == "engine":  # the teacher's own engine scores each batch (starting now, in the background)
            from launch.processes.teacher_scorer import TeacherScorer

            scorer = TeacherScorer(cfg, cfg.teacher.path, log=progress.message, devices=devices.pop(0))
            scorer.start()
        if not cfg.resume:  # the engines start while the learner does (a resume first learns what to skip)
            graph.start_actors(skip=[], version=0)
        graph.start_learner(rank_cores, cluster=cluster, weight_sync_token=secrets.weight_sync_token)
        driver = Driver(cfg, graph, data, run_dir, graph.buffer_address, progress, secrets=secrets.public(),
                        keeper=keeper)
        driver.teacher, driver.scorer = teacher, scorer
        if cfg.resume:
            graph.start_actors(skip=driver.restore(Path(cfg.resume)), version=driver.version)
        graph.await_actors()
        graph.connect_weight_sync()
        driver.write_processes()
        ws = cfg.weight_sync
        if graph.actors:
            progress.message(f"[graph] weight sync: {ws.backend}, {ws.mode} pushes in {cfg.model.dtype}"
                             + (f" (a full push every {ws.full_every} versions)" if ws.mode == "delta" else ""))
        if cfg.resume:  # engines started from the initial model: bring them to the checkpoint's weights
            graph.push_weights(driver.version)
        return driver.run()
    finally:
        for role in (teacher, scorer):
            if role is not None:
                role.close()
        graph.shutdown()
        if keeper is not None:
            keeper.stop()
