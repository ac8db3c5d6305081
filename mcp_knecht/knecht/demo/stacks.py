"""The language stacks of the demo projects: their commands, and how success and failure read in
their logs (`{slug}` and `{sha7}` are filled in per project and commit)."""

from __future__ import annotations

import msgspec


class _Stack(msgspec.Struct, frozen=True):
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
