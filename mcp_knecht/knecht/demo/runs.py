"""Deterministic, realistic demo data for Knecht: projects, workflows, runs, actions and logs.

Everything derives from one `random.Random(seed)` and a fixed base time, so a seed always yields
the same rows (tests compare digests). Rows are buffered and written in batches with
`execute_many`, one transaction per flush, so that a million runs stream through in bounded memory.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from mcp_knecht.errors import ConflictError
from mcp_knecht.store.database import Database, Transaction

BASE_TIME = datetime(2026, 11, 1, tzinfo=UTC)
BATCH_ROWS = 5_000
SPAN = timedelta(days=60)  # runs are spread over this window after BASE_TIME, whatever their count

FAILURE_KINDS: tuple[str, ...] = (
    "test_assertion",
    "dependency_install",
    "timeout",
    "out_of_memory",
    "flaky_network",
    "bad_workflow_syntax",
)
# Where each kind of failure surfaces: the action that fails.
FAILING_ACTION = {
    "test_assertion": "test",
    "dependency_install": "install",
    "timeout": "test",
    "out_of_memory": "test",
    "flaky_network": "install",
    "bad_workflow_syntax": "parse-workflow",
}
FAILURE_WEIGHTS = (30, 18, 12, 12, 18, 10)

USERS = ("anna.schmidt", "jonas.weber", "mei.chen", "lukas.bauer", "sara.okafor", "tom.nguyen")
SCHEDULER = "knecht-scheduler"


@dataclass(frozen=True)
class DemoSummary:
    projects: int
    workflows: int
    workflow_versions: int
    runs: int
    failed_runs: int
    actions: int
    log_lines: int
    failure_kinds: tuple[str, ...]
    example_failed_runs: dict[str, int] = field(default_factory=dict)
    """The first failed run id of each failure kind: handy starting points for a demo."""
    big_log: tuple[int, int, int] | None = None
    """(run id, action id, lines) of the very large action log made by `log_mb`, if any."""

    def describe(self) -> str:
        examples = ", ".join(f"{kind} → run {run}" for kind, run in self.example_failed_runs.items())
        return (
            f"{self.projects} projects, {self.workflows} workflows ({self.workflow_versions} versions), "
            f"{self.runs} runs ({self.failed_runs} failed), {self.actions} actions, "
            f"{self.log_lines} log lines\n"
            f"failure kinds: {examples or 'none'}"
            + (
                f"\nlarge log: run {self.big_log[0]}, action {self.big_log[1]} ({self.big_log[2]} lines)"
                if self.big_log
                else ""
            )
        )


# --- Project catalogue ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stack:
    """What differs between languages: commands, and how success and failure read in the logs."""

    install: str
    lint: str
    build: str
    test: str
    deploy: str
    install_ok: tuple[str, ...]
    build_ok: tuple[str, ...]
    test_ok: tuple[str, ...]
    test_assertion: tuple[str, ...]
    dependency_error: tuple[str, ...]
    download_host: str
    exit_dependency: int = 1


PYTHON = _Stack(
    install="pip install -r requirements.txt -r requirements-dev.txt",
    lint="ruff check . && mypy app",
    build="docker build -t registry.internal/{slug}:{sha7} .",
    test="pytest -q --maxfail=1",
    deploy="helm upgrade --install {slug} chart/ --set image.tag={sha7}",
    install_ok=(
        "Collecting fastapi==0.115.4",
        "Collecting sqlalchemy==2.0.36",
        "Collecting psycopg[binary]==3.2.3",
        "Installing collected packages: typing-extensions, pydantic-core, pydantic, starlette, fastapi",
        "Successfully installed 47 packages",
    ),
    build_ok=(
        "#5 [2/6] COPY requirements.txt .",
        "#6 [3/6] RUN pip install --no-cache-dir -r requirements.txt",
        "#9 exporting to image",
        "#9 naming to registry.internal/{slug}:{sha7} done",
    ),
    test_ok=(
        "============================= test session starts ==============================",
        "collected 312 items",
        "tests/test_api.py ........................................................ [ 18%]",
        "tests/test_payments.py ................................................... [ 61%]",
        "tests/test_webhooks.py ................................................... [100%]",
        "======================= 312 passed in 41.27s ===================================",
    ),
    test_assertion=(
        "============================= test session starts ==============================",
        "collected 312 items",
        "tests/test_api.py ........................................................ [ 18%]",
        "tests/test_payments.py ..............F",
        "=================================== FAILURES ===================================",
        "_______________________ test_refund_returns_200 ________________________________",
        "",
        "client = <starlette.testclient.TestClient object at 0x7f3a2c1d5e10>",
        "",
        "    def test_refund_returns_200(client):",
        '        response = client.post("/v1/payments/pay_8812/refund", json={"amount": 1299})',
        ">       assert 200 == response.status_code",
        "E       assert 200 == 500",
        "E        +  where 500 = <Response [500]>.status_code",
        "",
        "tests/test_payments.py:88: AssertionError",
        "----------------------------- Captured log call --------------------------------",
        "ERROR    app.payments:refunds.py:54 KeyError: 'currency' while building refund for pay_8812",
        "=========================== short test summary info ============================",
        "FAILED tests/test_payments.py::test_refund_returns_200 - assert 200 == 500",
        "!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!",
        "=================== 1 failed, 129 passed in 18.02s =============================",
    ),
    dependency_error=(
        "Collecting fastapi==0.115.4",
        "Collecting pydantic<2",
        "INFO: pip is looking at multiple versions of fastapi to determine which version is compatible.",
        "ERROR: Cannot install -r requirements.txt (line 3) and pydantic<2 because these package "
        "versions have conflicting dependencies.",
        "",
        "The conflict is caused by:",
        "    The user requested pydantic<2",
        "    fastapi 0.115.4 depends on pydantic!=1.8, !=2.0.0, !=2.1.0, <3.0.0 and >=1.7.4",
        "    sqlmodel 0.0.22 depends on pydantic>=2.0",
        "",
        "ERROR: ResolutionImpossible: for help visit "
        "https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts",
    ),
    download_host="files.pythonhosted.org",
)

GO = _Stack(
    install="go mod download",
    lint="go vet ./... && staticcheck ./...",
    build="go build -trimpath -o dist/{slug} ./cmd/{slug}",
    test="go test -race ./...",
    deploy="goreleaser release --clean",
    install_ok=(
        "go: downloading github.com/spf13/cobra v1.8.1",
        "go: downloading github.com/charmbracelet/lipgloss v0.13.0",
        "go: downloading golang.org/x/sync v0.8.0",
    ),
    build_ok=("building dist/{slug} for linux/amd64", "dist/{slug}: 14.2 MB"),
    test_ok=(
        "ok  \tgithub.com/acme/{slug}/internal/config\t0.412s",
        "ok  \tgithub.com/acme/{slug}/internal/runner\t2.873s",
        "ok  \tgithub.com/acme/{slug}/cmd/{slug}\t1.104s",
    ),
    test_assertion=(
        "--- FAIL: TestStatusCommand/remote_error (0.02s)",
        "    status_test.go:57: GET /api/runs/42: got status 500, want 200",
        '    status_test.go:58: assert 200 == 500: body = "internal error: nil pointer in run cache"',
        "FAIL",
        "FAIL\tgithub.com/acme/{slug}/cmd/{slug}\t1.311s",
        "ok  \tgithub.com/acme/{slug}/internal/config\t0.398s",
        "FAIL",
    ),
    dependency_error=(
        "go: downloading github.com/spf13/cobra v1.8.1",
        "go: github.com/acme/knecht-sdk@v0.9.0: reading github.com/acme/knecht-sdk/go.mod at "
        "revision v0.9.0: unknown revision v0.9.0",
        "go: module github.com/acme/knecht-sdk@v0.9.0 found (v0.8.3), but does not contain "
        "package github.com/acme/knecht-sdk/runs",
    ),
    download_host="proxy.golang.org",
)

NODE = _Stack(
    install="npm ci",
    lint="npm run lint && npm run typecheck",
    build="npm run build",
    test="npm test -- --ci --reporters=default",
    deploy="aws s3 sync dist/ s3://{slug}-prod --delete && aws cloudfront create-invalidation",
    install_ok=(
        "added 1312 packages, and audited 1313 packages in 38s",
        "214 packages are looking for funding",
        "found 0 vulnerabilities",
    ),
    build_ok=(
        "vite v5.4.10 building for production...",
        "✓ 1843 modules transformed.",
        "dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB",
        "✓ built in 21.38s",
    ),
    test_ok=(
        "PASS src/cart/Cart.test.tsx",
        "PASS src/checkout/Checkout.test.tsx",
        "Test Suites: 58 passed, 58 total",
        "Tests:       412 passed, 412 total",
    ),
    test_assertion=(
        "FAIL src/checkout/Checkout.test.tsx",
        "  ● Checkout > submits the order and shows the confirmation",
        "",
        "    expect(received).toBe(expected) // Object.is equality",
        "",
        "    Expected: 200",
        "    Received: 500",
        "",
        "      42 |     const res = await submitOrder(cart);",
        "    > 43 |     expect(res.status).toBe(200);",
        "         |                        ^",
        "",
        "Test Suites: 1 failed, 57 passed, 58 total",
        "Tests:       1 failed, 411 passed, 412 total",
    ),
    dependency_error=(
        "npm ERR! code ERESOLVE",
        "npm ERR! ERESOLVE unable to resolve dependency tree",
        "npm ERR! ",
        "npm ERR! While resolving: storefront-web@3.14.0",
        "npm ERR! Found: react@18.3.1",
        "npm ERR! node_modules/react",
        'npm ERR!   react@"^18.3.1" from the root project',
        "npm ERR! ",
        "npm ERR! Could not resolve dependency:",
        'npm ERR! peer react@"^19.0.0" from @acme/design-system@5.0.0',
        "npm ERR! Fix the upstream dependency conflict, or retry",
        "npm ERR! this command with --force or --legacy-peer-deps",
    ),
    download_host="registry.npmjs.org",
)

RUST = _Stack(
    install="cargo fetch --locked",
    lint="cargo clippy --all-targets -- -D warnings",
    build="cargo build --release",
    test="cargo test --release",
    deploy="cargo publish --token $CARGO_REGISTRY_TOKEN",
    install_ok=("    Updating crates.io index", "  Downloaded 86 crates (7.9 MB) in 2.31s"),
    build_ok=(
        "   Compiling serde v1.0.214",
        "   Compiling {slug} v0.7.2 (/workspace)",
        "    Finished `release` profile [optimized] target(s) in 1m 12s",
    ),
    test_ok=(
        "running 148 tests",
        "test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s",
    ),
    test_assertion=(
        "running 148 tests",
        "test decode::tests::roundtrip_large_frame ... FAILED",
        "",
        "failures:",
        "",
        "---- decode::tests::roundtrip_large_frame stdout ----",
        "thread 'decode::tests::roundtrip_large_frame' panicked at src/decode.rs:211:9:",
        "assertion `left == right` failed: assert 200 == 500 (frame length)",
        "  left: 200",
        " right: 500",
        "",
        "test result: FAILED. 147 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
    ),
    dependency_error=(
        "    Updating crates.io index",
        'error: failed to select a version for the requirement `tokio = "^2.0"`',
        "candidate versions found which didn't match: 1.41.0, 1.40.0, 1.39.3, ...",
        "location searched: crates.io index",
        "required by package `{slug} v0.7.2 (/workspace)`",
    ),
    download_host="static.crates.io",
)

TERRAFORM = _Stack(
    install="terraform init -input=false",
    lint="terraform fmt -check -recursive && tflint",
    build="terraform plan -out=plan.tfplan",
    test="go test ./test/... -timeout 30m",
    deploy="terraform apply -auto-approve plan.tfplan",
    install_ok=(
        "Initializing the backend...",
        "Initializing provider plugins...",
        "- Installing hashicorp/aws v5.74.0...",
        "Terraform has been successfully initialized!",
    ),
    build_ok=("Refreshing state... [id=vpc-0a1b2c3d]", "Plan: 3 to add, 1 to change, 0 to destroy."),
    test_ok=("--- PASS: TestVpcModule (84.20s)", "ok  \tgithub.com/acme/infra-live/test\t91.112s"),
    test_assertion=(
        "--- FAIL: TestAlbHealthCheck (132.51s)",
        "    alb_test.go:41: health check https://staging.internal/healthz: got 500, want 200",
        "    alb_test.go:42: assert 200 == 500",
        "FAIL\tgithub.com/acme/infra-live/test\t140.022s",
    ),
    dependency_error=(
        "Initializing provider plugins...",
        '- Finding hashicorp/aws versions matching "~> 6.0, < 5.80.0"...',
        "╷",
        "│ Error: Failed to query available provider packages",
        "│ Could not retrieve the list of available versions for provider hashicorp/aws: no available",
        "│ releases match the given constraints ~> 6.0, < 5.80.0",
        "╵",
    ),
    download_host="releases.hashicorp.com",
)


@dataclass(frozen=True)
class _ProjectSpec:
    slug: str
    name: str
    description: str
    stack: _Stack
    weight: int
    features: tuple[str, ...]


PROJECTS: tuple[_ProjectSpec, ...] = (
    _ProjectSpec(
        "payments-api",
        "Payments API",
        "Python/FastAPI service that takes payments and refunds; deployed to Kubernetes.",
        PYTHON,
        30,
        ("refund-currency", "idempotency-keys", "sca-flow"),
    ),
    _ProjectSpec(
        "knecht-cli",
        "Knecht CLI",
        "Go command-line client for the Knecht API.",
        GO,
        18,
        ("status-watch", "log-follow"),
    ),
    _ProjectSpec(
        "storefront-web",
        "Storefront Web",
        "React/Vite storefront single-page app served from S3.",
        NODE,
        24,
        ("checkout-v2", "dark-mode", "cart-badge"),
    ),
    _ProjectSpec(
        "fastcodec",
        "fastcodec",
        "Rust library for a zero-copy binary frame codec, published to crates.io.",
        RUST,
        14,
        ("simd-decode", "no-std"),
    ),
    _ProjectSpec(
        "infra-live",
        "Infrastructure (live)",
        "Terraform for the AWS accounts: VPCs, ALBs, RDS.",
        TERRAFORM,
        14,
        ("rds-upgrade", "alb-waf"),
    ),
)

# Action lists per workflow. Every run starts by parsing its workflow; install precedes build
# precedes test everywhere, so every failure kind can happen in every workflow.
WORKFLOW_ACTIONS: dict[str, tuple[str, ...]] = {
    "ci": ("parse-workflow", "checkout", "install", "lint", "build", "test"),
    "release": ("parse-workflow", "checkout", "install", "build", "test", "publish", "deploy"),
    "nightly": ("parse-workflow", "checkout", "install", "build", "test", "report"),
}
ACTION_SECONDS = {
    "parse-workflow": (1, 2),
    "checkout": (2, 9),
    "install": (20, 95),
    "lint": (8, 40),
    "build": (40, 240),
    "test": (60, 600),
    "publish": (10, 45),
    "deploy": (45, 200),
    "report": (3, 12),
}
WORKFLOW_INPUTS: dict[str, dict[str, dict[str, Any]]] = {
    "ci": {
        "run_slow_tests": {"type": "boolean", "required": False, "default": False},
        "log_level": {
            "type": "choice",
            "required": False,
            "default": "info",
            "options": ["debug", "info", "warning"],
        },
    },
    "release": {
        "version": {"type": "string", "required": True, "default": None},
        "environment": {
            "type": "choice",
            "required": True,
            "default": "staging",
            "options": ["staging", "production"],
        },
        "dry_run": {"type": "boolean", "required": False, "default": False},
    },
    "nightly": {
        "suite": {"type": "choice", "required": False, "default": "full", "options": ["smoke", "full"]},
    },
}


# --- Helpers -------------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _sha(rng: random.Random) -> str:
    return f"{rng.getrandbits(160):040x}"


def _token(rng: random.Random, alphabet: str, length: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))


def _workflow_yaml(name: str, version: int, stack: _Stack, slug: str) -> str:
    inputs = WORKFLOW_INPUTS[name]
    trigger = {
        "ci": "  push:\n    branches: ['**']\n  pull_request: {}\n",
        "release": "  push:\n    tags: ['v*']\n  manual: {}\n",
        "nightly": "  schedule:\n    - cron: '0 2 * * *'\n",
    }[name]
    lines = [f"# .knecht/workflows/{name}.yml (version {version})", f"name: {name}", "on:", trigger.rstrip()]
    lines.append("inputs:")
    for key, spec in inputs.items():
        lines.append(f"  {key}:")
        lines.append(f"    type: {spec['type']}")
        lines.append(f"    required: {str(spec['required']).lower()}")
        if spec.get("default") is not None:
            lines.append(f"    default: {json.dumps(spec['default'])}")
        if "options" in spec:
            lines.append(f"    options: [{', '.join(spec['options'])}]")
    # Later versions tighten timeouts and add caching, so versions really differ.
    lines.append(f"timeout-minutes: {20 if version >= 2 else 30}")
    lines.append("actions:")
    commands = {
        "checkout": "git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA",
        "install": stack.install,
        "lint": stack.lint,
        "build": stack.build,
        "test": stack.test,
        "publish": "knecht artifacts upload dist/",
        "deploy": stack.deploy,
        "report": "knecht report --format junit results/*.xml",
    }
    for action in WORKFLOW_ACTIONS[name][1:]:
        lines.append(f"  - name: {action}")
        lines.append(f"    run: {commands[action].format(slug=slug, sha7='$SHORT_SHA')}")
        if action == "install" and version >= 3:
            lines.append("    cache: [~/.cache, node_modules, target]")
        if action == "test":
            lines.append(f"    timeout-minutes: {20 if version >= 2 else 30}")
            if version >= 4:
                lines.append("    retries: 1")
    return "\n".join(lines) + "\n"


@dataclass
class _Project:
    id: int
    spec: _ProjectSpec
    branches: list[tuple[str, str]]
    workflows: dict[str, int]  # name -> workflow id
    secrets: dict[str, str]
    versions: dict[int, list[datetime]]  # workflow id -> created_at of versions 1..n


class _Writer:
    """Buffers rows per table; flushes all tables together, parents first, when one is full."""

    TABLES = {
        "runs": "INSERT INTO runs (id, project_id, workflow_id, workflow_version, number, status, trigger,"
        " branch, commit_sha, inputs_json, created_by, queued_at, started_at, finished_at, rerun_of)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        "actions": "INSERT INTO actions (id, run_id, position, name, status, exit_code, started_at,"
        " finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        "log_lines": "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, ?, ?, ?)",
    }

    def __init__(self, db: Database, progress: Callable[[str], None] | None, total_runs: int) -> None:
        self.db = db
        self.progress = progress
        self.total_runs = total_runs
        self.buffers: dict[str, list[Sequence[Any]]] = {table: [] for table in self.TABLES}
        self.runs_written = 0

    def add(self, table: str, row: Sequence[Any]) -> None:
        self.buffers[table].append(row)

    @property
    def full(self) -> bool:
        return any(len(rows) >= BATCH_ROWS for rows in self.buffers.values())

    async def flush(self) -> None:
        if not any(self.buffers.values()):
            return
        async with self.db.transaction() as tx:
            for table, sql in self.TABLES.items():
                rows = self.buffers[table]
                for start in range(0, len(rows), BATCH_ROWS):
                    await tx.execute_many(sql, rows[start : start + BATCH_ROWS])
        self.runs_written += len(self.buffers["runs"])
        self.buffers = {table: [] for table in self.TABLES}
        if self.progress:
            self.progress(f"{self.runs_written}/{self.total_runs} runs written")


# --- The generator -------------------------------------------------------------------------------


async def fill_demo_data(
    db: Database,
    *,
    seed: int = 7,
    runs: int = 600,
    progress: Callable[[str], None] | None = None,
    log_mb: int = 0,
    run_logs: bool = True,
) -> DemoSummary:
    """Fill an empty database with demo data; refuses one that already holds projects.

    `log_mb` > 0 makes the failed test action of the first assertion failure a very large log
    (about that many megabytes of verbose test output, the failure at its end), for benchmarks.
    `run_logs=False` skips every other log line: a million runs for a list benchmark, quickly.
    """
    if runs < 0 or log_mb < 0:
        raise ValueError("runs and log_mb must be >= 0")
    rng = random.Random(seed)
    async with db.transaction() as tx:
        existing = await tx.fetch_one("SELECT COUNT(*) AS n FROM projects")
        if existing and existing["n"]:
            raise ConflictError(
                f"The database {db.url} already holds {existing['n']} projects; demo data goes into an "
                "empty database only. Pass a fresh --db URL (e.g. sqlite:///./knecht-demo.db)."
            )
        projects, version_count = await _insert_catalogue(tx, rng)
    writer = _Writer(db, progress, runs)
    generator = _RunGenerator(rng, projects, runs, writer, with_logs=run_logs)
    await generator.generate()
    await writer.flush()
    big_log = None
    if log_mb and "test_assertion" in generator.examples:
        big_log = await _grow_log(db, generator.examples["test_assertion"], log_mb, progress)
    # Fresh statistics let the planner pick the selective index for combined filters (a trigger and
    # a branch that match nothing together: 72 ms → 0.1 ms over a million runs).
    async with db.transaction() as tx:
        await tx.execute("ANALYZE")
    workflows = sum(len(p.workflows) for p in projects)
    return DemoSummary(
        projects=len(projects),
        workflows=workflows,
        workflow_versions=version_count,
        runs=runs,
        failed_runs=generator.failed,
        actions=generator.action_id,
        log_lines=generator.log_lines,
        failure_kinds=tuple(k for k in FAILURE_KINDS if k in generator.examples),
        example_failed_runs=dict(generator.examples),
        big_log=big_log,
    )


async def _insert_catalogue(tx: Transaction, rng: random.Random) -> tuple[list[_Project], int]:
    projects: list[_Project] = []
    workflow_id = 0
    version_count = 0
    upper_digits = string.ascii_uppercase + string.digits
    alnum = string.ascii_letters + string.digits
    for index, spec in enumerate(PROJECTS, start=1):
        created = BASE_TIME - timedelta(days=400 - index * 37)
        await tx.execute(
            "INSERT INTO projects (id, slug, name, description, repository_url, default_branch, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                index,
                spec.slug,
                spec.name,
                spec.description,
                f"https://git.acme.internal/acme/{spec.slug}.git",
                "main",
                _iso(created),
            ),
        )
        branches = [("main", _sha(rng))] + [(f"feature/{f}", _sha(rng)) for f in spec.features]
        branches.append((f"fix/{rng.choice(('flaky-test', 'ci-cache', 'timeouts'))}", _sha(rng)))
        await tx.execute_many(
            "INSERT INTO branches (project_id, name, head_sha) VALUES (?, ?, ?)",
            [(index, name, sha) for name, sha in branches],
        )
        # Secret values are generated, then echoed into some logs so scrubbing has work to do.
        secrets = {
            "AWS_ACCESS_KEY_ID": "AKIA" + _token(rng, upper_digits, 16),
            "AWS_SECRET_ACCESS_KEY": _token(rng, alnum + "/+", 40),
            "DEPLOY_TOKEN": "ghp_" + _token(rng, alnum, 36),
            "DATABASE_URL": f"postgres://{spec.slug.replace('-', '_')}:{_token(rng, alnum, 18)}"
            f"@db.internal:5432/{spec.slug.replace('-', '_')}",
        }
        plain = {
            "LOG_LEVEL": "info",
            "REGION": "eu-central-1",
            "ARTIFACT_BUCKET": f"acme-{spec.slug}-artifacts",
        }
        await tx.execute_many(
            "INSERT INTO project_variables (project_id, name, value, secret, updated_at, updated_by)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                (index, name, value, 1, _iso(created + timedelta(days=3)), rng.choice(USERS))
                for name, value in secrets.items()
            ]
            + [
                (index, name, value, 0, _iso(created + timedelta(days=1)), rng.choice(USERS))
                for name, value in plain.items()
            ],
        )
        workflows: dict[str, int] = {}
        versions: dict[int, list[datetime]] = {}
        for name in WORKFLOW_ACTIONS:
            workflow_id += 1
            count = rng.randint(2, 4)
            # Version 1 predates the runs; later versions land inside the run window.
            window = int(SPAN.total_seconds())
            later = sorted(BASE_TIME + timedelta(seconds=rng.randint(0, window)) for _ in range(count - 1))
            stamps = [created + timedelta(days=2), *later]
            await tx.execute(
                "INSERT INTO workflows (id, project_id, name, path, current_version, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (workflow_id, index, name, f".knecht/workflows/{name}.yml", count, _iso(stamps[0])),
            )
            await tx.execute_many(
                "INSERT INTO workflow_versions (workflow_id, version, definition, inputs_json, created_at,"
                " created_by) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (
                        workflow_id,
                        v,
                        _workflow_yaml(name, v, spec.stack, spec.slug),
                        json.dumps(WORKFLOW_INPUTS[name], sort_keys=True),
                        _iso(stamps[v - 1]),
                        rng.choice(USERS),
                    )
                    for v in range(1, count + 1)
                ],
            )
            version_count += count
            workflows[name] = workflow_id
            versions[workflow_id] = stamps
        projects.append(_Project(index, spec, branches, workflows, secrets, versions))
    return projects, version_count


class _RunGenerator:
    def __init__(
        self, rng: random.Random, projects: list[_Project], total: int, writer: _Writer, *, with_logs: bool = True
    ) -> None:
        self.with_logs = with_logs
        self.rng = rng
        self.projects = projects
        self.total = total
        self.writer = writer
        self.weights = [p.spec.weight for p in projects]
        self.numbers: dict[int, int] = {}
        self.recent_failed: dict[
            int, list[tuple[int, str, str, str]]
        ] = {}  # workflow -> (id, branch, sha, kind)
        self.examples: dict[str, int] = {}
        self.failed = 0
        self.action_id = 0
        self.log_lines = 0
        self.failures_seen = 0

    async def generate(self) -> None:
        step = SPAN.total_seconds() / max(self.total, 1)
        # The newest runs are still in flight: a few running, then a few queued at the very end.
        in_flight = min(6, self.total // 40)
        for run_id in range(1, self.total + 1):
            queued = BASE_TIME + timedelta(seconds=int((run_id - 1) * step + self.rng.random() * step))
            from_end = self.total - run_id
            if from_end < in_flight // 2:
                status = "queued"
            elif from_end < in_flight:
                status = "running"
            else:
                status = None
            self._run(run_id, queued, status)
            if self.writer.full:
                await self.writer.flush()

    def _pick_kind(self) -> str:
        # The first failures cycle through every kind, so even a small demo shows each of them.
        kind = (
            FAILURE_KINDS[self.failures_seen]
            if self.failures_seen < len(FAILURE_KINDS)
            else self.rng.choices(FAILURE_KINDS, FAILURE_WEIGHTS)[0]
        )
        self.failures_seen += 1
        return kind

    def _run(self, run_id: int, queued: datetime, forced_status: str | None) -> None:
        rng = self.rng
        project = rng.choices(self.projects, self.weights)[0]
        workflow = rng.choices(("ci", "release", "nightly"), (78, 8, 14))[0]
        workflow_id = project.workflows[workflow]
        rerun_of: int | None = None
        kind: str | None = None
        candidates = self.recent_failed.get(workflow_id)
        if workflow == "nightly":
            trigger, branch, actor = "schedule", "main", SCHEDULER
        elif candidates and rng.random() < 0.25:
            trigger, actor = "rerun", rng.choice(USERS)
            rerun_of, branch, sha, previous_kind = candidates.pop(rng.randrange(len(candidates)))
        elif workflow == "release":
            trigger, branch, actor = rng.choice(("manual", "push")), "main", rng.choice(USERS)
        else:
            trigger = rng.choices(("push", "pull_request", "manual"), (58, 38, 4))[0]
            feature = [name for name, _ in project.branches if name != "main"]
            branch = "main" if trigger == "push" and rng.random() < 0.45 else rng.choice(feature)
            actor = rng.choice(USERS)
        if rerun_of is None:
            sha = dict(project.branches)[branch] if rng.random() < 0.2 else _sha(rng)
        # A rerun of a flaky failure usually passes; a rerun of a real bug usually fails the same way.
        if forced_status:
            status = forced_status
        elif rerun_of is not None:
            repeat = 0.15 if previous_kind in ("flaky_network", "timeout") else 0.5
            status = "failed" if rng.random() < repeat else "succeeded"
            kind = previous_kind if status == "failed" else None
        else:
            roll = rng.random()
            status = "failed" if roll < 0.16 else "cancelled" if roll < 0.21 else "succeeded"
        if status == "failed" and kind is None:
            kind = self._pick_kind()
        if status == "failed":
            assert kind is not None
            self.failed += 1
            self.examples.setdefault(kind, run_id)
            self.recent_failed.setdefault(workflow_id, []).append((run_id, branch, sha, kind))
            del self.recent_failed[workflow_id][:-5]

        version = sum(1 for stamp in project.versions[workflow_id] if stamp <= queued) or 1
        self.numbers[workflow_id] = number = self.numbers.get(workflow_id, 0) + 1
        inputs = {key: spec["default"] for key, spec in WORKFLOW_INPUTS[workflow].items()}
        if workflow == "release":
            inputs["version"] = f"v{rng.randint(1, 3)}.{number // 4}.{number % 4}"
            inputs["environment"] = (
                "production" if trigger == "push" else rng.choice(("staging", "production"))
            )
        elif trigger == "manual" and workflow == "ci":
            inputs["run_slow_tests"] = True

        started = None if status == "queued" else queued + timedelta(seconds=rng.randint(2, 90))
        finished, run_log = self._actions(run_id, project, workflow, status, kind, started, sha, branch)
        header = [
            f"{_iso(queued)} Run #{number} of {workflow} (version {version}) queued by {actor} via {trigger}"
            + (f" (rerun of run {rerun_of})" if rerun_of else ""),
            f"{_iso(queued)} Repository {project.spec.slug} @ {branch} ({sha[:12]})",
        ]
        if started is None:
            header.append(f"{_iso(queued)} Waiting for a runner (3 jobs ahead in queue linux-x64)")
        else:
            header.append(f"{_iso(started)} Picked up by runner knecht-runner-{rng.randint(1, 12):02d}")
            header.append(f"{_iso(started)} Inputs: {json.dumps(inputs, sort_keys=True)}")
        self._log(run_id, 0, header + run_log)
        self.writer.add(
            "runs",
            (
                run_id,
                project.id,
                workflow_id,
                version,
                number,
                status,
                trigger,
                branch,
                sha,
                json.dumps(inputs, sort_keys=True),
                actor,
                _iso(queued),
                _iso(started) if started else None,
                _iso(finished) if finished else None,
                rerun_of,
            ),
        )

    def _actions(
        self,
        run_id: int,
        project: _Project,
        workflow: str,
        status: str,
        kind: str | None,
        started: datetime | None,
        sha: str,
        branch: str,
    ) -> tuple[datetime | None, list[str]]:
        """Write the actions of one run; returns the run's finish time and its own log lines."""
        rng = self.rng
        names = WORKFLOW_ACTIONS[workflow]
        stop_at = len(names)  # index of the action where the run stops (fails, is cancelled or runs)
        if status == "failed":
            assert kind is not None
            stop_at = names.index(FAILING_ACTION[kind])
        elif status in ("cancelled", "running"):
            stop_at = rng.randrange(1, len(names))
        elif status == "queued":
            stop_at = -1
        clock = started
        run_log: list[str] = []
        for position, name in enumerate(names, start=1):
            self.action_id += 1
            action_id = self.action_id
            index = position - 1
            if status == "queued" or index > stop_at:
                state = "skipped" if status in ("failed", "cancelled") else "pending"
                self.writer.add("actions", (action_id, run_id, position, name, state, None, None, None))
                continue
            assert clock is not None
            low, high = ACTION_SECONDS[name]
            seconds = rng.randint(low, high)
            outcome = "succeeded"
            exit_code: int | None = 0
            if index == stop_at and status != "succeeded":
                outcome = {"failed": "failed", "cancelled": "cancelled", "running": "running"}[status]
                exit_code = None
                if status == "failed":
                    assert kind is not None
                    exit_code = {"timeout": 124, "out_of_memory": 137}.get(kind, 1)
                    if kind == "timeout":
                        seconds = 20 * 60
            begin = clock
            end = begin + timedelta(seconds=seconds)
            lines = self._action_log(project, name, outcome, kind, sha, branch, workflow)
            self._log(run_id, action_id, lines)
            run_log.append(f"{_iso(begin)} ▶ {name} started")
            if outcome == "running":
                self.writer.add(
                    "actions", (action_id, run_id, position, name, "running", None, _iso(begin), None)
                )
                continue
            run_log.append(
                f"{_iso(end)} {'✔' if outcome == 'succeeded' else '✖'} {name} {outcome} in {seconds}s"
                + (f" (exit code {exit_code})" if exit_code else "")
            )
            self.writer.add(
                "actions", (action_id, run_id, position, name, outcome, exit_code, _iso(begin), _iso(end))
            )
            clock = end + timedelta(seconds=rng.randint(0, 3))
        if status in ("queued", "running"):
            return None, run_log
        assert clock is not None
        if status == "failed":
            failed_name = names[stop_at]
            run_log.append(
                f"{_iso(clock)} Run failed: action '{failed_name}' failed; remaining actions skipped"
            )
        elif status == "cancelled":
            run_log.append(f"{_iso(clock)} Run cancelled by {rng.choice(USERS)}; remaining actions skipped")
        else:
            run_log.append(f"{_iso(clock)} Run succeeded")
        return clock, run_log

    def _log(self, run_id: int, action_id: int, lines: list[str]) -> None:
        if not self.with_logs:
            return
        for line_no, text in enumerate(lines, start=1):
            self.writer.add("log_lines", (run_id, action_id, line_no, text))
        self.log_lines += len(lines)

    def _action_log(
        self,
        project: _Project,
        name: str,
        outcome: str,
        kind: str | None,
        sha: str,
        branch: str,
        workflow: str,
    ) -> list[str]:
        rng = self.rng
        spec = project.spec
        stack = spec.stack
        slug, sha7 = spec.slug, sha[:7]
        failing = outcome == "failed"

        def fmt(lines: Sequence[str]) -> list[str]:
            return [line.replace("{slug}", slug).replace("{sha7}", sha7) for line in lines]

        if name == "parse-workflow":
            if failing and kind == "bad_workflow_syntax":
                line = rng.choice((14, 22, 31))
                return [
                    f"Reading .knecht/workflows/{workflow}.yml at {sha7}",
                    f"yaml: line {line}: mapping values are not allowed in this context",
                    f"  {line - 1} |   - name: test",
                    f"  {line} |     run: {stack.test}: --junitxml=results/junit.xml",
                    "     |                  ^",
                    f"Error: the workflow file .knecht/workflows/{workflow}.yml is not valid YAML; "
                    "no actions were started.",
                ]
            return [
                f"Reading .knecht/workflows/{workflow}.yml at {sha7}",
                f"Workflow {workflow}: {len(WORKFLOW_ACTIONS[workflow]) - 1} actions, inputs validated",
            ]
        if name == "checkout":
            return [
                f"$ git clone --depth 1 https://git.acme.internal/acme/{slug}.git .",
                f"HEAD is now at {sha7} on {branch}",
            ]
        if name == "install":
            lines = [f"$ {stack.install}"]
            if rng.random() < 0.08:
                # A developer debugging credentials left this in; the scrubber must catch it.
                lines.append(f"+ echo AWS_ACCESS_KEY_ID={project.secrets['AWS_ACCESS_KEY_ID']}")
                lines.append(f"AWS_ACCESS_KEY_ID={project.secrets['AWS_ACCESS_KEY_ID']}")
            if failing and kind == "dependency_install":
                return lines + fmt(stack.dependency_error) + [f"Error: '{stack.install}' exited with code 1"]
            if failing and kind == "flaky_network":
                return (
                    lines
                    + fmt(stack.install_ok[:1])
                    + [
                        f"Downloading https://{stack.download_host}/packages/…/archive.tar.gz (18.4 MB)",
                        f"WARNING: Retrying (Retry(total=2)) after connection broken by "
                        f"'ConnectionResetError(104, 'Connection reset by peer')': {stack.download_host}",
                        "WARNING: Retrying (Retry(total=1)) after connection broken by 'ReadTimeoutError'",
                        f"ERROR: Could not download from https://{stack.download_host}: "
                        "[Errno 104] Connection reset by peer while downloading (read 9.1 MB of 18.4 MB)",
                        f"Error: '{stack.install}' exited with code 1",
                    ]
                )
            return lines + fmt(stack.install_ok)
        if name == "lint":
            return [f"$ {stack.lint}", "All checks passed."]
        if name == "build":
            lines = [f"$ {stack.build}".replace("{slug}", slug).replace("{sha7}", sha7), *fmt(stack.build_ok)]
            if kind == "out_of_memory":
                # The cause shows here, one action before the one that gets killed.
                lines[1:1] = [
                    "warning: container memory at 3.6 GiB of 4.0 GiB limit after dependency compilation",
                    "warning: build cache (2.9 GiB) is kept in /tmp and counts against the memory limit",
                ]
                lines.append("warning: memory still at 3.8 GiB of 4.0 GiB after build; tmpfs not cleaned up")
            if rng.random() < 0.05:
                lines.append(f"Connecting to {project.secrets['DATABASE_URL']} for migrations check… ok")
            return lines
        if name == "test":
            lines = [f"$ {stack.test}".replace("{slug}", slug)]
            if kind == "timeout":
                lines.append(
                    "warning: redis at redis.internal:6379 not reachable; tests fall back to retry loops"
                )
            if failing and kind == "test_assertion":
                extra = []
                if rng.random() < 0.3:
                    password = project.secrets["DATABASE_URL"].split(":")[2].split("@")[0]
                    extra = [f"DEBUG db config: password={password} host=db.internal"]
                return lines + extra + fmt(stack.test_assertion)
            if failing and kind == "timeout":
                return (
                    lines
                    + fmt(stack.test_ok[:1])
                    + [
                        "waiting for lock on redis key 'webhook-retry' (attempt 12)…",
                        "waiting for lock on redis key 'webhook-retry' (attempt 13)…",
                        "Error: Action exceeded timeout of 20m; the process was terminated (exit code 124)",
                    ]
                )
            if failing and kind == "out_of_memory":
                return (
                    lines
                    + fmt(stack.test_ok[:1])
                    + [
                        "[runner] memory usage 3.97 GiB / 4.00 GiB",
                        "Killed",
                        "Error: process exited with code 137 (SIGKILL: the container ran out of memory)",
                    ]
                )
            if outcome in ("cancelled", "running"):
                return lines + fmt(stack.test_ok[:1])
            return lines + fmt(stack.test_ok)
        if name == "publish":
            return ["$ knecht artifacts upload dist/", f"Uploaded 3 artifacts to acme-{slug}-artifacts"]
        if name == "deploy":
            lines = [f"$ {stack.deploy}".replace("{slug}", slug).replace("{sha7}", sha7)]
            if rng.random() < 0.25:
                lines.append(f"Authenticating with token {project.secrets['DEPLOY_TOKEN']}")
            return [*lines, f"Deployed {slug} {sha7} successfully"]
        return ["$ knecht report --format junit results/*.xml", "Report uploaded: 1 file"]


async def _grow_log(
    db: Database, run_id: int, megabytes: int, progress: Callable[[str], None] | None
) -> tuple[int, int, int]:
    """Put megabytes of verbose test output before the failure in one action's log."""
    action = await db.fetch_one(
        "SELECT id FROM actions WHERE run_id = ? AND status = 'failed' ORDER BY position LIMIT 1", (run_id,)
    )
    assert action is not None
    action_id = action["id"]
    tail = await db.fetch_all(
        "SELECT text FROM log_lines WHERE run_id = ? AND action_id = ? ORDER BY line_no", (run_id, action_id)
    )
    rng = random.Random(megabytes)
    budget = megabytes * 1_000_000
    written = 0
    line_no = 0
    modules = ("api", "payments", "refunds", "webhooks", "ledger", "currency", "customers", "reports")
    start = BASE_TIME + timedelta(days=1)
    async with db.transaction() as tx:
        await tx.execute("DELETE FROM log_lines WHERE run_id = ? AND action_id = ?", (run_id, action_id))
    while written < budget:
        batch = []
        for _ in range(BATCH_ROWS * 4):
            line_no += 1
            moment = start + timedelta(milliseconds=line_no * 7)
            module = modules[line_no % len(modules)]
            if line_no % 250_000 == 0:
                text = f"{_iso(moment)} WARNING slow test: tests/test_{module}.py::test_case_{line_no} took 4.2s"
            else:
                text = (
                    f"{_iso(moment)} tests/test_{module}.py::test_{module}_case_{line_no:07d}"
                    f"[param-{rng.randrange(10_000):04d}] PASSED  [{min(99, written * 100 // budget):>3}%]"
                )
            batch.append((run_id, action_id, line_no, text))
            written += len(text) + 1
            if written >= budget:
                break
        async with db.transaction() as tx:
            await tx.execute_many(
                "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, ?, ?, ?)", batch
            )
        if progress and line_no % (BATCH_ROWS * 40) == 0:
            progress(f"large log: {written // 1_000_000} of {megabytes} MB")
    rows = [(run_id, action_id, line_no + i, row["text"]) for i, row in enumerate(tail, start=1)]
    async with db.transaction() as tx:
        await tx.execute_many("INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, ?, ?, ?)", rows)
    return run_id, action_id, line_no + len(rows)
