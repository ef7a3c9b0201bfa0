"""The HTML report (``asyncthrottle.run.html``, charts from ``asyncthrottle.run.svg``): made from
real-shaped report data in-process; one real run of ``scripts/nan_steps.py``; a headless
chromium's screenshot and console where chromium is installed."""

from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from _runs import SCRIPTS, SharedRuns

from asyncthrottle.run.html import render, write
from asyncthrottle.run.report import schema
from asyncthrottle.run.svg import BUCKETS, POINTS, Line, Marks, bucket_size, chart, reduce
from asyncthrottle.run.text import GLOSSARY
from asyncthrottle.run.validate import problems

CHROMIUM = shutil.which("chromium")


def _report(steps: int, *, seed: int = 1, folder: Path | None = None) -> dict[str, Any]:
    """A report as ``collect()`` makes it (checked against its schema below), for ``steps``
    steps: a warm-up step, two NaN losses a third of the way, a spike at two thirds, a sync site
    whose file is ``folder/train.py`` (where given)."""
    rng = random.Random(seed)
    step_s: list[float | None] = [0.005 + 0.001 * rng.random() for _ in range(steps)]
    wait: list[float | None] = [0.0005 * rng.random() for _ in range(steps)]
    losses: list[float | None] = [2.0 / (1 + k / 100) + 0.05 * rng.random()
                                  for k in range(steps)]
    bad = [k for k in (steps // 3, steps // 3 + 1) if k < steps]
    for k in bad:
        losses[k] = None
    if steps:
        step_s[0] = 0.8
        losses[2 * steps // 3] = 50.0
    file = str(folder / "train.py") if folder is not None else None
    wall = sum(v for v in step_s if v is not None)
    return {
        "schema": 1, "script": "train.py", "argv": ["train.py", "--lr", "0.1"], "exit_code": 0,
        "steps": steps, "steps_per_s": steps / wall if wall else 0.0, "losses": losses,
        "nonfinite": bad, "last_nonfinite": None,
        "syncs": [{"site": "train.py:5", "call": "Tensor.item", "count": steps,
                   "per_step": 1.0, "in_step": True, "via": None, "file": file},
                  {"site": "train.py:9", "call": "Tensor.tolist", "count": 1,
                   "per_step": 1 / max(1, steps), "in_step": False, "via": None,
                   "file": file}] if steps else [],
        "verdict": "input-bound" if steps else "unknown",
        "advice": "the host spends its time taking batches from the source",
        "sections": {"forward": 2.5, "backward": 3.1, "optimizer": None} if steps else {},
        "input_wait_s": 0.2, "input_wait_fraction": 0.4 if steps else 0.0,
        "loader": {"num_workers": 0, "pin_memory": True, "pin_memory_in_effect": False,
                   "pin_memory_off": "no accelerator", "batch_size": 32, "batched_by": None},
        "framework": None, "error": None,
        "stats": {"steps": steps, "wall_s": wall, "wait_fraction": 0.0, "fetch_s": 0.4 * wall,
                  "body_s": 0.6 * wall, "rank_score_0": 1.0, "rank_score_1": 0.62,
                  "slowest_rank": 1} if steps else {},
        "seen": {"forwards": steps, "backwards": steps, "optimizer_steps": steps,
                 "autograd_grad": 0, "other_threads": 0, "processes": 0},
        "trace": None,
        "per_step": {"step_s": step_s, "input_wait_s": wait},
        "suggestions": ["train.py:5 calls loss.item() every step: thr.defer(loss) instead, or "
                        "read it every 50 steps"] if steps else [],
        **({"synchronous": False} if steps else {}),
        "environment": {"date": "2026-12-07T20:00:00+00:00", "python": "CPython 3.11.7",
                        "torch": "2.14.1", "device": "cuda:0" if steps else None,
                        "device_name": "NVIDIA H100 80GB HBM3" if steps else None,
                        "os": "Linux-6.1-x86_64", "asyncthrottle": "0.3.0", "rank": 0,
                        "world_size": 1},
    }


def _train_py(folder: Path) -> None:
    (folder / "train.py").write_text(
        "import torch\n\nfor x in loader:\n    loss = model(x)\n    total += loss.item()\n"
        "    opt.step()\n\n# after <the> loop & done\nprint(losses.tolist())\n")


def _sync_table(page: str) -> str:
    return page[page.index('id="syncs"'):page.index('id="sections"')]


def test_the_report_data_used_here_is_real_shaped() -> None:
    assert problems(_report(50, folder=Path("/x")), schema()) == []
    assert problems(_report(0), schema()) == []


def test_the_page_is_self_contained(tmp_path: Path) -> None:
    _train_py(tmp_path)
    page = render(_report(300, folder=tmp_path))
    for outside in ("http://", "https://", "<link", "@import", "url(", "src=", "<script",
                    "<img", "<iframe", "//cdn", "@font-face"):
        assert outside not in page, outside
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # each chart says what it is, for a screen reader
    assert page.count('role="img"') == 2 and page.count("aria-labelledby=") == 2


def test_the_verdict_and_its_figures_come_first(tmp_path: Path) -> None:
    page = render(_report(300, folder=tmp_path))
    verdict = page.index('class="badge">input-bound<')
    assert verdict < page.index('id="suggestions"') < page.index('id="per-step"') \
        < page.index('id="loss"') < page.index('id="syncs"') < page.index('id="sections"') \
        < page.index('id="ranks"') < page.index('id="command"')
    head = page[:page.index('id="suggestions"')]
    for figure in ("<dt>steps</dt><dd>300", "<dt>exit code</dt><dd>0", "<dt>input wait</dt>"
                   "<dd>40%", "<dt>host waited</dt><dd>0%", "<dt>fetching</dt><dd>40%"):
        assert figure in head, figure
    assert "taking batches from the source" in head
    # the loader as the script wrote it, what torch runs beside it
    assert "<code>DataLoader(num_workers=0, pin_memory=True (off: no accelerator), batch_size=32)" \
           "</code>" in page


def test_site_call_suggestion_and_source_are_escaped(tmp_path: Path) -> None:
    data = _report(20, folder=tmp_path)
    (tmp_path / "train.py").write_text("x = 1\n" * 4 + 'print("<script>alert(1)</script>")\n')
    data["syncs"][0].update(call="Tensor.<b>item</b>", via="<script>pkg.py:3")
    data["syncs"][1]["site"] = "<script>alert(2)</script>.py:9"
    data["suggestions"] = ["train.py:5 calls <script>alert(3)</script> & more"]
    data["argv"] = ["train.py", "<script>"]
    data["losses_by_optimizer"] = {"<i>opt</i>": data["losses"]}
    data["nonfinite_by_optimizer"] = {"<i>opt</i>": {"nonfinite": [], "last_nonfinite": None}}
    data["environment"].update(os="<script>os", device_name="<b>gpu</b>")
    data["patches"] = [{"site": "train.py:5", "call": "x", "certain": True, "why": None,
                        "diff": "@@ -1 +1 @@\n-<script>\n+<b>x</b>\n"}]
    data["options"] = ["--suggest", "<script>.patch"]
    data["loader"].update(batched_by="<script>pkg.Loader", pin_memory_off="<i>why</i>")
    page = render(data)
    assert "<script" not in page and "<b>" not in page and "<i>" not in page
    assert "&lt;script&gt;os" in page and '<span class="del">-&lt;script&gt;</span>' in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the source line
    assert "&lt;script&gt;alert(2)&lt;/script&gt;.py:9" in page  # the site
    assert "&lt;script&gt;alert(3)&lt;/script&gt; &amp; more" in page  # the suggestion
    assert "Tensor.&lt;b&gt;item&lt;/b&gt;" in page and "in &lt;script&gt;pkg.py:3" in page
    assert "&lt;i&gt;opt&lt;/i&gt;" in page
    assert "(off: &lt;i&gt;why&lt;/i&gt;)" in page and "by &lt;script&gt;pkg&#x27;s Loader" in page


def test_the_sync_table_shows_each_site_s_source_lines(tmp_path: Path) -> None:
    _train_py(tmp_path)
    table = _sync_table(render(_report(40, folder=tmp_path)))
    # train.py:5 with two lines before it and one after, its own marked
    assert re.search(r'<span><span class="ln">3</span>for x in loader:</span>'
                     r'<span><span class="ln">4</span>    loss = model\(x\)</span>'
                     r'<span class="here"><span class="ln">5</span>    total \+= loss\.item\(\)'
                     r'</span><span><span class="ln">6</span>    opt\.step\(\)</span>', table)
    assert '<span class="ln">8</span># after &lt;the&gt; loop &amp; done' in table
    assert "in steps" in table and "outside steps" in table and "Tensor.tolist" in table
    # no "time blocked" column where no row has it
    assert "time blocked" not in table


def test_a_site_without_its_file_says_so_and_source_reads_files_through_the_caller() -> None:
    data = _report(40, folder=Path("/no/such/folder"))
    assert _sync_table(render(data)).count("source not found") == 2
    asked: list[str] = []

    def source(path: str) -> list[str]:
        asked.append(path)
        return [f"line {k}" for k in range(1, 20)]
    table = _sync_table(render(data, source=source))
    assert '<span class="here"><span class="ln">5</span>line 5</span>' in table
    assert asked == [str(Path("/no/such/folder") / "train.py")]  # once a page


def test_time_blocked_is_a_column_where_a_row_has_it_a_step_with_its_total(
        tmp_path: Path) -> None:
    data = _report(40, folder=tmp_path)
    data["syncs"][0].update(blocked_s=0.0123, blocked_per_step_s=0.0123 / 40)
    table = _sync_table(render(data))
    # the text's unit (text: "0.307 ms/step"), the total beside it
    assert '>time blocked a step</th>' in table
    assert '<td class="num">0.307 ms/step<span class="via">12.3 ms in all</span></td>' in table
    assert "\u2013</td>" in table  # the row not timed
    # no steps to share it: the total alone
    data["syncs"][0]["blocked_per_step_s"] = None
    assert '<td class="num">12.3 ms in all</td>' in _sync_table(render(data))


@pytest.mark.parametrize("above", ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
                                   "\u2029", "\r", "\r\n"])
def test_the_read_s_line_is_marked_whatever_stands_above_it(tmp_path: Path, above: str) -> None:
    # Python numbers lines at \n, \r\n and \r only: str.splitlines() also splits at the others
    source = f"import torch\n# a{above}b\nx = 1\nloss.item()\ny = 2\n"
    (tmp_path / "train.py").write_bytes(source.encode("utf-8"))
    line = 4 if above not in ("\r", "\r\n") else 5
    compile(source, "train.py", "exec")  # Python reads it
    data = _report(40, folder=tmp_path)
    data["syncs"][0]["site"] = f"train.py:{line}"
    table = _sync_table(render(data))
    assert f'<span class="here"><span class="ln">{line}</span>loss.item()</span>' in table
    if above not in ("\r", "\r\n"):
        # shown, not a line break: as Python writes it
        assert f'# a<span class="ctl">{repr(above)[1:-1]}</span>b' in table


def test_a_synchronous_run_s_page_says_once_why_a_fix_pays_on_an_accelerator() -> None:
    data = _report(40)
    page = render(data)
    assert "runs each op as it is issued" not in page
    data["synchronous"] = True
    page = render(data)
    assert page.count("on an accelerator each read in the steps waits") == 1
    assert page.index("runs each op as it is issued") > page.index('id="syncs"')


def test_each_suggestion_shows_its_patch_and_the_command_that_writes_them_all() -> None:
    data = _report(40)
    diff = ("--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,3 @@\n import torch\n"
            "+import asyncthrottle as at\n x = 1\n@@ -5,1 +6,1 @@\n-    total += loss.item()\n"
            "+    thr.defer(loss, name=\"<loss>\")\n")
    data["patches"] = [{"site": "train.py:5", "call": "Tensor.item", "certain": True,
                        "diff": diff, "why": None}]
    page = render(data)
    said = page[page.index('id="suggestions"'):page.index('id="per-step"')]
    assert '<span class="file">--- a/train.py</span>' in said
    assert '<span class="add">+import asyncthrottle as at</span>' in said
    assert '<span class="del">-    total += loss.item()</span>' in said
    assert '<span class="add">+    thr.defer(loss, name=&quot;&lt;loss&gt;&quot;)</span>' in said
    assert ("<p>the 1 certain rewrite as one patch: <code>python -m asyncthrottle run --suggest "
            "fix.patch train.py --lr 0.1</code></p>") in said
    # with --suggest: where it went and how to apply it
    data["options"] = ["--suggest", "my fix.patch"]
    said = render(data)
    assert ("<p>--suggest my fix.patch: 1 certain rewrite; apply it: <code>patch -p1 &lt; "
            "&#x27;my fix.patch&#x27;</code> (or git apply in this folder)</p>") in said
    # no certain rewrite: the suggestions alone, no command
    data["patches"] = [{**data["patches"][0], "certain": False, "diff": None, "why": "x"}]
    data["options"] = []
    said = render(data)
    assert "<pre class=\"diff\"" not in said and "--suggest" not in said


def test_the_environment_a_bug_report_needs_is_on_the_page() -> None:
    page = render(_report(40))
    found = page[page.index('id="environment"'):]
    for label, value in (("date", "2026-12-07T20:00:00+00:00"), ("Python", "CPython 3.11.7"),
                         ("torch", "2.14.1"), ("device", "cuda:0 (NVIDIA H100 80GB HBM3)"),
                         ("OS", "Linux-6.1-x86_64"), ("asyncthrottle", "0.3.0"),
                         ("rank", "0 of 1")):
        assert f'<tr><th>{label}</th><td class="mono">{value}</td></tr>' in found, label
    data = _report(40)
    del data["environment"]
    assert "it is older than its environment" in render(data)


def test_each_optimizer_gets_its_series_and_nan_steps_are_marked() -> None:
    data = _report(80)
    data["losses_by_optimizer"] = {"optimizer 0 (Adam)": data["losses"],
                                   "optimizer 1 (SGD)": [0.5] * 80}
    data["nonfinite_by_optimizer"] = {
        "optimizer 0 (Adam)": {"nonfinite": [26, 27], "last_nonfinite": None},
        "optimizer 1 (SGD)": {"nonfinite": [], "last_nonfinite": None}}
    page = render(data)
    loss = page[page.index('id="loss"'):page.index('id="syncs"')]
    assert ">optimizer 0 (Adam)</text>" in loss and ">optimizer 1 (SGD)</text>" in loss
    assert "<title>NaN/Inf loss steps 26\u201327</title>" in loss
    assert "optimizer 0 (Adam): first" in loss and "NaN/Inf at steps 26, 27" in loss


def test_the_strip_draws_the_per_step_series_there_are_and_says_when_there_are_none() -> None:
    data = _report(30)
    strip = _strip(render(data))
    assert ">step time</text>" in strip and ">input wait</text>" in strip
    # the warm-up step is above the cut axis, named
    assert "\u25b2 above the axis: step time, step 0: 800 ms" in strip
    data["per_step"] = {"input_wait_s": data["per_step"]["input_wait_s"]}
    strip = _strip(render(data))
    assert ">input wait</text>" in strip and ">step time</text>" not in strip
    del data["per_step"]
    assert "this report has no per-step times" in _strip(render(data))


def _strip(page: str) -> str:
    return page[page.index('id="per-step"'):page.index('id="loss"')]


def test_a_loss_spike_does_not_flatten_the_curve_it_is_marked_above_the_axis() -> None:
    page = render(_report(300))
    loss = page[page.index('id="loss"'):page.index('id="syncs"')]
    assert "\u25b2 above the axis: loss, step 200: 50" in loss
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([-\d.]+)</text>', loss)]
    assert max(ticks) < 5


def test_a_report_with_no_steps_warns_and_says_what_the_hooks_saw() -> None:
    data = _report(0)
    data["syncs"] = None
    data.pop("per_step")
    data["seen"].update(forwards=3, processes=0)
    page = render(data)
    head = page[:page.index('id="suggestions"')]
    # a warning's colour, not a verdict's
    assert '<section class="verdict warn" aria-label="verdict"><p><span class="badge">no step ' \
           'found</span>' in head and "badge\">unknown" not in head
    assert "no training step found: the script ran 3 training forwards but never" in head
    assert "<li>3 training forwards</li>" in head and "<li>0 backward() calls</li>" in head
    assert "<li>0 processes the script started</li>" in head
    said = page[page.index('id="suggestions"'):page.index('id="per-step"')]
    assert "none:" not in said and "no step was found, so nothing is suggested" in said
    assert "<svg" not in page and "none delivered" in page and "not counted" in page
    assert "\u2013 (no step found one)" in page[page.index('id="environment"'):]


def test_a_script_that_did_not_start_is_said_so_not_that_it_never_trained() -> None:
    data = _report(0)
    data["raised"] = {"type": "SyntaxError", "message": "'(' was never closed",
                      "site": "train.py:3", "started": False}
    page = render(data)
    assert ("the script did not start: SyntaxError at train.py:3: &#x27;(&#x27; was never closed"
            in page) and "never called backward()" not in page


def test_the_footer_points_to_the_glossary_of_the_report_s_words() -> None:
    footer = render(_report(3)).partition("<footer>")[2]
    assert f"<code>{GLOSSARY}</code>" in footer and "Diagnose a script" in footer


def test_ranks_and_the_command_line() -> None:
    page = render(_report(20))
    ranks = page[page.index('id="ranks"'):page.index('id="command"')]
    assert "1 (slowest)" in ranks and "0.62" in ranks
    assert "python -m asyncthrottle run train.py --lr 0.1" in page[page.index('id="command"'):]
    # the command as the user typed it: the installed one
    page = render({**_report(20), "command": "asyncthrottle",
                   "trace": {"path": "t.json", "written": True}})
    command = page[page.index('id="command"'):]
    assert '<pre class="mono">asyncthrottle run train.py --lr 0.1</pre>' in command
    assert "<code>asyncthrottle plot t.json</code>" in command and "python -m" not in command


def test_render_names_what_it_needs_when_given_something_else() -> None:
    with pytest.raises(ValueError, match=r"data=.*schema 1.*got a dict with schema None"):
        render({})
    with pytest.raises(ValueError, match="got list"):
        render([])  # type: ignore[arg-type]


def test_downsampling_keeps_each_bucket_s_extremes_and_every_nan_mark() -> None:
    steps = 1_000_000
    size = bucket_size(steps)
    assert size == steps // BUCKETS and bucket_size(POINTS) == 1
    values: list[float | None] = [1.0] * steps
    values[123_457] = 99.0
    values[654_321] = -5.0
    values[500_000:500_000 + size] = [None] * size  # one bucket with none
    bands = reduce(values, steps, size)
    assert len(bands) == BUCKETS
    assert bands[123_457 // size] == (1.0, 99.0) and bands[654_321 // size] == (-5.0, 1.0)
    assert bands[500_000 // size] is None and bands[0] == (1.0, 1.0)
    # lone NaN steps far apart: each keeps its own mark; neighbours merge into one
    svg = chart([Line("loss", values, "#000")], steps=steps, ident="t", title="t",
                y_label="loss", zero=False, marks=[Marks("NaN/Inf loss", [7, 400_001, 400_002,
                                                                          999_999])])
    assert svg is not None
    marks = re.findall(r"<title>NaN/Inf loss ([^<]*)</title>", svg)
    assert marks == ["1 step, steps 0\u2013999", "2 steps, steps 400,000\u2013400,999",
                     "1 step, steps 999,000\u2013999,999"]
    # the spike sets the top of the axis, the dip its bottom
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([-\d.]+)</text>', svg)]
    assert max(ticks) >= 99 and min(ticks) <= -5


def test_a_million_steps_make_a_page_under_2_mb(tmp_path: Path) -> None:
    data = _report(1_000_000, folder=tmp_path)
    started = time.perf_counter()
    page = render(data)
    took = time.perf_counter() - started
    size = len(page.encode())
    print(f"a million steps: {size:,} bytes in {took:.2f} s")
    assert size < 2_000_000
    # the NaN losses, the spike and the warm-up step are still drawn
    assert "<title>NaN/Inf loss 2 steps, steps 333,000\u2013333,999</title>" in page
    assert "\u25b2 above the axis: step time, steps 0\u2013999: 800 ms" in page
    assert "least to largest value of each 1,000 steps" in page


def _chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={tmp / 'profile'}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)


def _console(page: Path, tmp: Path) -> list[str]:
    """What the page said on the console (errors included) as chromium loaded it."""
    done = _chromium(page, tmp, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert "</html>" in done.stdout
    return [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")
def test_chromium_shows_the_page_with_no_console_message(tmp_path: Path) -> None:
    _train_py(tmp_path)
    page = tmp_path / "report.html"
    write(_report(3000, folder=tmp_path), page)
    shot = tmp_path / "shot.png"
    _chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,2400")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    assert _console(page, tmp_path) == []
    # the check can fail: a page that logs is caught
    noisy = tmp_path / "noisy.html"
    noisy.write_text(page.read_text().replace("</main>", "<script>console.error('x')</script>"
                                                         "</main>"))
    assert len(_console(noisy, tmp_path)) == 1


def test_a_real_run_s_page_marks_its_nan_steps_and_shows_its_read(shared_runs: SharedRuns) -> None:
    # the run test_blocked's time blocked reads
    done, data, folder = shared_runs.run("nan_steps.py", html=True)
    report, written = folder / "report.json", folder / "report.html"
    record = folder / "events.jsonl"
    assert done.returncode == 0, done.stderr.decode()
    assert data["options"] == ["--json", str(report), "--events", str(record), "--html",
                               str(written)]
    assert data["nonfinite"] == [37, 38] and len(data["per_step"]["step_s"]) == 80
    # the page run wrote is the page of its report, with the command that made it
    assert written.read_text(encoding="utf-8") == render(data)
    assert f"run --json {report} --events {record} --html {written} nan_steps.py</pre>" in \
        render(data)
    lines = (SCRIPTS / "nan_steps.py").read_text().splitlines()
    item, cast = lines.index("    logged.append(loss.item())") + 1, lines.index("val = float(val)") + 1
    assert [(row["site"], row["call"], row["in_step"]) for row in data["syncs"]] == [
        (f"nan_steps.py:{item}", "Tensor.item", True),
        (f"nan_steps.py:{cast}", "Tensor.__float__", False)]
    page = render(data)
    assert "<title>NaN/Inf loss steps 37\u201338</title>" in page
    table = _sync_table(page)
    assert "logged.append(loss.item())" in table and "val = float(val)" in table
    assert "thr.defer(loss)" in page and ">step time</text>" in page
    assert math.isfinite(data["losses"][-1])
