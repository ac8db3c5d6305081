"""The demo catalogue: projects, their workflows (actions, inputs, YAML definitions), branches and
variables, and inserting it all; the runs are made from it afterwards."""

from __future__ import annotations

import json
import random
import string
from datetime import datetime, timedelta
from typing import Any

import msgspec

from mcp_knecht.core.database import Transaction
from mcp_knecht.knecht.demo.common import SPAN, USERS, _iso, _sha, _token
from mcp_knecht.knecht.demo.stacks import GO, NODE, PYTHON, RUST, TERRAFORM, _Stack


class _ProjectSpec(msgspec.Struct, frozen=True):
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


class _Project(msgspec.Struct):
    id: int
    spec: _ProjectSpec
    branches: list[tuple[str, str]]
    workflows: dict[str, int]  # name -> workflow id
    secrets: dict[str, str]
    versions: dict[int, list[datetime]]  # workflow id -> created_at of versions 1..n


async def _insert_catalogue(tx: Transaction, rng: random.Random, start: datetime) -> tuple[list[_Project], int]:
    """Projects (created before `start`, the run window's beginning), branches, variables, workflows."""
    projects: list[_Project] = []
    workflow_id = 0
    version_count = 0
    upper_digits = string.ascii_uppercase + string.digits
    alnum = string.ascii_letters + string.digits
    for index, spec in enumerate(PROJECTS, start=1):
        created = start - timedelta(days=400 - index * 37)
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
            later = sorted(start + timedelta(seconds=rng.randint(0, window)) for _ in range(count - 1))
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
