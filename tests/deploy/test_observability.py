"""The monitoring content (deploy/observability.py): rendered files current, every metric
name real in vLLM 0.33.0, every expression accepted by Prometheus's promtool, and a real
Prometheus (Debian's package) scraping a local /metrics and evaluating them all."""

import ast
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from deepinfer_sm80.deploy import observability as obs
from deepinfer_sm80.deploy.config_files import CONFIG_DIR

OBS_DIR = CONFIG_DIR / "observability"
METRIC = re.compile(r"\bvllm:[a-z0-9_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _need(tool: str) -> str:
    """The tool's path, or a skip; the tests that call it are marked ``tools``, so under
    DEEPINFER_REQUIRE_TOOLS=1 the skip is a failure (tests/conftest.py)."""
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not found: apt-get install prometheus (Debian's package brings both)")
    return path


def test_rendered_files_are_current(tmp_path):
    obs.render(tmp_path)
    for rel in ("grafana/dashboards/deepinfer.json", "prometheus/deepinfer.rules.yml"):
        assert (tmp_path / rel).read_text() == (OBS_DIR / rel).read_text(), (
            f"{rel} is stale: run `deepinfer observability --write configs/observability`"
        )


def test_dashboard_covers_what_operators_need():
    titles = {p["title"] for p in obs.dashboard()["panels"]}
    needed = {
        "Request rate",
        "Time to first token",
        "Inter-token latency",
        "KV-cache usage",
        "Preemptions",
        "Queue depth",
        "DSpark acceptance per draft position",
        "DSpark mean accepted length",
    }
    assert needed <= titles
    per_pos = next(p for p in obs.PANELS if "per draft position" in p.title)
    assert "by (position)" in per_pos.exprs[0][1]
    alerts = {a["alert"] for a in obs.ALERTS}
    assert {"DeepInferKVCacheNearlyFull", "DeepInferDSparkAcceptanceCollapse"} <= alerts


def _is_metric_literal(node) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"vllm:[a-z0-9_]+", node.value) is not None
    )


def _vllm_metric_names() -> dict[str, str]:
    """Every ``vllm:*`` metric name string literal in the installed vLLM package, with
    its kind where the constructor call says (counter/gauge/histogram)."""
    import vllm

    names: dict[str, str] = {}
    for path in Path(vllm.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = ast.unparse(node.func).lower()
                kind = next((k for k in ("counter", "histogram", "gauge") if k in func), "")
                for kw in node.keywords:
                    v = kw.value
                    if kw.arg == "name" and _is_metric_literal(v):
                        names[v.value] = kind or names.get(v.value, "")
            if _is_metric_literal(node):
                names.setdefault(node.value, "")
    return names


@pytest.mark.vllm
def test_every_metric_name_exists_in_vllm():
    known = _vllm_metric_names()
    assert "vllm:kv_cache_usage_perc" in known, "the name scan found nothing: scan is broken"
    used = set()
    for expr in obs.dashboard_exprs() + obs.rule_exprs():
        used |= set(METRIC.findall(expr))
    assert used
    for name in sorted(used):
        base = name
        for suffix in SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in known:
                base = name.removesuffix(suffix)
                kind = known[base]
                if suffix == "_total":
                    assert kind in ("counter", ""), f"{name}: {base} is a {kind}, not a counter"
                if suffix == "_bucket":
                    assert kind in ("histogram", ""), f"{name}: {base} is a {kind}"
                break
        assert base in known, f"{name}: vLLM 0.33.0 defines no metric {base}"
        if base == name:
            assert known[base] in ("gauge", ""), f"{name} is a {known[base]}: add its suffix"


@pytest.mark.tools
def test_rules_and_config_pass_promtool(tmp_path):
    promtool = _need("promtool")
    rules = OBS_DIR / "prometheus" / "deepinfer.rules.yml"
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # The config names the rule file by its path inside the container.
    shutil.copy(rules, tmp_path / "deepinfer.rules.yml")
    cfg = yaml.safe_load((OBS_DIR / "prometheus" / "prometheus.yml").read_text())
    cfg["rule_files"] = ["deepinfer.rules.yml"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.tools
def test_every_dashboard_expression_passes_promtool(tmp_path):
    promtool = _need("promtool")
    group = {"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(obs.dashboard_exprs())
    ]}  # fmt: skip
    f = tmp_path / "dash.rules.yml"
    f.write_text(yaml.safe_dump({"groups": [group]}))
    out = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # And a broken expression is caught (the check can fail).
    f.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "x:y", "expr": "sum(rate(vllm:x[5m]"}]}]}))  # fmt: skip
    assert subprocess.run([promtool, "check", "rules", str(f)], capture_output=True).returncode


# ------------------------------------------------------- a real Prometheus scraping


class _FakeVllmMetrics:
    """A /metrics exposition with vLLM 0.33.0's names and types, moving over time:
    5 drafts/s, 2.5 accepted tokens per draft, position p accepted with (5-p)/6."""

    def __init__(self):
        self.start = time.monotonic()

    def text(self) -> str:
        t = time.monotonic() - self.start
        drafts = 5 * t
        lines = []

        def counter(name, value, labels=""):
            lines.append(f"# TYPE {name} counter")
            lines.append(f'{name}_total{{model_name="m"{labels}}} {value}')

        def gauge(name, value):
            lines.append(f"# TYPE {name} gauge")
            lines.append(f'{name}{{model_name="m"}} {value}')

        def histogram(name, per_s):
            lines.append(f"# TYPE {name} histogram")
            for le, frac in (("0.1", 0.5), ("1.0", 0.9), ("+Inf", 1.0)):
                lines.append(f'{name}_bucket{{model_name="m",le="{le}"}} {per_s * t * frac}')
            lines.append(f'{name}_sum{{model_name="m"}} {per_s * t * 0.3}')
            lines.append(f'{name}_count{{model_name="m"}} {per_s * t}')

        counter("vllm:spec_decode_num_drafts", drafts)
        counter("vllm:spec_decode_num_draft_tokens", 5 * drafts)
        counter("vllm:spec_decode_num_accepted_tokens", 2.5 * drafts)
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        for p in range(5):
            lines.append(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",'
                f'position="{p}"}} {drafts * (5 - p) / 6}'
            )
        counter("vllm:request_success", 2 * t, ',finished_reason="stop"')
        counter("vllm:num_preemptions", 0.5 * t)
        counter("vllm:prompt_tokens", 1000 * t)
        counter("vllm:generation_tokens", 100 * t)
        gauge("vllm:kv_cache_usage_perc", 0.97)
        gauge("vllm:num_requests_waiting", 3)
        gauge("vllm:num_requests_running", 4)
        histogram("vllm:time_to_first_token_seconds", 2)
        histogram("vllm:inter_token_latency_seconds", 50)
        return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.slow
@pytest.mark.tools
def test_real_prometheus_scrapes_and_evaluates_everything(tmp_path):
    prometheus = _need("prometheus")
    fake = _FakeVllmMetrics()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = fake.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shutil.copy(OBS_DIR / "prometheus" / "deepinfer.rules.yml", tmp_path / "rules.yml")
    cfg = yaml.safe_load((OBS_DIR / "prometheus" / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(tmp_path / "rules.yml")]
    cfg["scrape_configs"][0]["static_configs"] = [
        {"targets": [f"127.0.0.1:{server.server_address[1]}"]}
    ]
    (tmp_path / "p.yml").write_text(yaml.safe_dump(cfg))
    rules = yaml.safe_load((tmp_path / "rules.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    port = _free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'p.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        rate = []
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                rate = _query(port, "deepinfer:spec_decode_acceptance_rate:rate5m")
            except OSError:
                continue
            if rate:
                break
        assert rate, "the recording rule never produced a value"
        assert float(rate[0]["value"][1]) == pytest.approx(0.5, rel=0.05)
        length = _query(port, "deepinfer:spec_decode_mean_accepted_length:rate5m")
        assert float(length[0]["value"][1]) == pytest.approx(3.5, rel=0.05)
        by_pos = _query(port, "deepinfer:spec_decode_acceptance_by_position:rate5m")
        got = {r["metric"]["position"]: float(r["value"][1]) for r in by_pos}
        assert got.keys() == {str(p) for p in range(5)}
        for p in range(5):
            assert got[str(p)] == pytest.approx((5 - p) / 6, rel=0.05)
        for expr in obs.dashboard_exprs():
            assert _query(port, expr), f"no data for dashboard expression: {expr}"
        # KV usage is 0.97 > 0.95: the alert is pending (its `for` has not elapsed).
        alerts = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts"))
        states = {a["labels"]["alertname"]: a["state"] for a in alerts["data"]["alerts"]}
        assert states.get("DeepInferKVCacheNearlyFull") in ("pending", "firing")
        assert "DeepInferDSparkAcceptanceCollapse" not in states
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()
