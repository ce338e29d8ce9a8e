"""Progress of a release's stages: what listeners are told, and the command line's bars."""

import io

from rich.console import Console

from kepsilon.cli import StageBars
from kepsilon.tasks.progress import add_listener, remove_listener, stage


class Recorder:
    def __init__(self):
        self.events = []

    def stage_started(self, name, total):
        self.events.append(("started", name, total))

    def stage_advanced(self, name, done, total):
        self.events.append(("advanced", name, done, total))

    def stage_finished(self, name, done, total, seconds):
        self.events.append(("finished", name, done, total))


def test_a_stage_tells_its_listeners_each_partition_then_its_end():
    recorder = Recorder()
    add_listener(recorder)
    try:
        with stage("perturb-suppress", 3) as progress:
            for _ in range(3):
                progress.advance()
    finally:
        remove_listener(recorder)
    with stage("not-heard", 1) as progress:  # a removed listener hears nothing
        progress.advance()
    assert recorder.events == [
        ("started", "perturb-suppress", 3),
        ("advanced", "perturb-suppress", 1, 3),
        ("advanced", "perturb-suppress", 2, 3),
        ("advanced", "perturb-suppress", 3, 3),
        ("finished", "perturb-suppress", 3, 3),
    ]


def test_the_command_line_draws_a_bar_per_stage_and_nothing_without_stages():
    output = io.StringIO()
    bars = StageBars(Console(file=output, width=100, force_terminal=False))
    bars.close()
    assert output.getvalue() == ""  # a release without stages prints what it printed before
    bars = StageBars(Console(file=output, width=100, force_terminal=False))
    for name, total in (("intake", 4), ("distribute", 4)):
        bars.stage_started(name, total)
        for done in range(1, total + 1):
            bars.stage_advanced(name, done, total)
        bars.stage_finished(name, total, total, 1.0)
    bars.close()
    shown = output.getvalue()
    assert "intake" in shown and "distribute" in shown and shown.count("4/4 partitions") == 2


def test_an_uncounted_stage_is_told_to_listeners_but_does_not_move_the_releases_progress():
    """The shard steps of the Dask engine (how many depends on the cut tree's depth) are stages of their
    own, outside the release's counted steps: the release's share done moves only with counted stages."""
    from kepsilon.tasks.progress import release_progress

    recorder = Recorder()
    add_listener(recorder)
    try:
        with release_progress(4, "release r") as release:
            with stage("cut-statistics", 3, counted=False) as progress:
                for _ in range(3):
                    progress.advance()
            assert release.done == 0
            with stage("distribute", 2) as progress:
                progress.advance(2)
            assert release.done == 2
    finally:
        remove_listener(recorder)
    assert ("advanced", "cut-statistics", 3, 3) in recorder.events
