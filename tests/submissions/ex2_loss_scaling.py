"""Fabricated submissions for ex2_loss_scaling, used by tests/test_exercises.py."""
# The part a "partial" submission gets right (its solution cells come from the source);
# every other part is left as released. Its score must equal exactly this part's points.
PARTIAL_PARTS = ["p3"]
# A submission whose part 3 merely wraps mpcourse's DynamicLossScaler (correct scales, step for
# step, and the same errors for bad settings): it must score 0 on part 3.
REFERENCE_CALLER = {
    "p3_solution": (
        "from mpcourse.scaling import DynamicLossScaler\n"
        "\n"
        "\n"
        "class DynamicScaler:\n"
        "    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,\n"
        "                 growth_interval=2000):\n"
        "        self._reference = DynamicLossScaler(init_scale, growth_factor, backoff_factor,\n"
        "                                            growth_interval)\n"
        "        self.growth_factor = self._reference.growth_factor\n"
        "        self.backoff_factor = self._reference.backoff_factor\n"
        "        self.growth_interval = self._reference.growth_interval\n"
        "\n"
        "    @property\n"
        "    def scale(self):\n"
        "        return self._reference.get_scale()\n"
        "\n"
        "    def update(self, found_inf):\n"
        "        self._reference._scale = self._reference._next_scale(bool(found_inf))\n"),
}
