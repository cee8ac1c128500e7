"""Fabricated submissions for ex8_bitwise_resume, used by tests/test_exercises.py."""
# The parts a "partial" submission gets right (its solution cells come from the source); every
# other part is left as released. Part 3 takes save and load as arguments, so it passes without
# Parts 1 and 2; Part 4 needs all three before it. The score must equal exactly these parts' points.
PARTIAL_PARTS = ["p1", "p3"]
# A submission whose load_checkpoint restores the global RNG with mpcourse.training's own helpers
# (correct results, bit for bit): it must score 0 on part 2. Its part 4 is the instructor's
# solution, but it resumes through that load_checkpoint, so it calls the library too and scores 0.
REFERENCE_CALLER = {
    "p2_solution": '''\
def load_checkpoint(run, path, skip=()):
    from mpcourse.training import _rng_state, _set_rng_state
    unknown = [name for name in skip if name not in PIECES]
    if unknown:
        raise ValueError(f"cannot skip {unknown}")
    state = torch.load(path, weights_only=True)
    if not isinstance(state, dict) or set(state) != set(PIECES):
        raise ValueError("not a checkpoint of this run")
    if "model" not in skip:
        run.model.load_state_dict(state["model"])
    if "masters" not in skip:
        with torch.no_grad():
            for master, saved in zip(run.masters, state["masters"]):
                master.copy_(saved)
    if "optimizer" not in skip:
        run.optimizer.load_state_dict(state["optimizer"])
    if "scaler" not in skip:
        run.scaler.load_state_dict(state["scaler"])
    if "rng" not in skip:
        _set_rng_state({**_rng_state(), "torch": state["rng"]})
    if "loader" not in skip:
        run.loader.set_state(state["loader"])
    if "step" not in skip:
        run.step = state["step"]
''',
    "p4_solution": '''\
def what_breaks_resume(steps=30, k=12, seed=0, width=32):
    result = {}
    for piece in PIECES:
        def load_without(run, path, piece=piece):
            load_checkpoint(run, path, skip=(piece,))
        result[piece] = first_divergence(steps, k, save_checkpoint, load_without, seed, width)
    return result
''',
}
