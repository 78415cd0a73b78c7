"""The UI path, as a person uses it: a real ``prefect server start`` with its UI on loopback,
``python -m h5forge.deployments.serve`` against it, and headless Chromium (Debian's
``chromium`` driven by Playwright's Python package -- no browser download) filling the
on-demand deployment's run form, submitting it, and watching the flow run reach Completed.

Screenshots of every step are kept in ``test-artifacts/ui/`` at the repository root (gitignored).
On failure the test prints what the browser saw (console errors, failed requests with their
bodies) and the tails of the server's and the runner's logs.

The server keeps its state in SQLite. Creating a flow run reads, then inserts; when another
connection writes in between (the runner marking its deployments ready on every poll, the
server's event persister), SQLite refuses the insert at once ("database is locked") and Prefect
answers 503, which its Python client retries by itself but the UI does not: it shows "Oops.
Something went wrong." and leaves the form filled in. The test then presses the button again,
as a person would; any other refusal fails the test.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest

from h5forge.flows.build import BuildConfig
from tests.deployments._processes import (
    BUILD_FLOW,
    REPO_ROOT,
    deployment_id,
    log_tail,
    prefect_server,
    served_deployments,
    server_log,
)

pytestmark = [pytest.mark.ui, pytest.mark.slow, pytest.mark.timeout(600)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "ui"
FINAL_STATES = ("Completed", "Failed", "Crashed", "Cancelled")
CREATE_FLOW_RUN = re.compile(r"/api/deployments/[0-9a-f-]+/create_flow_run$")
SUBMIT_ATTEMPTS = 5


@pytest.fixture
def chromium() -> Path:
    """Debian's chromium; a missing browser skips locally but fails in CI (CI=true)."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; .ci/run installs it, so CI must not skip the UI test")
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture
def screenshots() -> Path:
    """A fresh ``test-artifacts/ui/`` folder, printed so the log says where to look."""
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    print(f"UI screenshots: {SCREENSHOTS}")
    return SCREENSHOTS


def _field(page, title: str):  # type: ignore[no-untyped-def]
    """The form property labelled ``title`` (the UI appends " (Optional)" to fields with
    defaults); the innermost match, so ``config``'s wrapper is never picked."""
    label = (
        "span[contains(@class,'schema-form-property__label')"
        f" and (normalize-space()='{title}' or normalize-space()='{title} (Optional)')]"
    )
    return page.locator(
        "xpath=//div[contains(concat(' ',normalize-space(@class),' '),' schema-form-property ')]"
        f"[div[contains(@class,'p-label__header')]//{label}]"
    ).last


class BrowserLog:
    """What the page reported that a screenshot does not show: console errors and warnings,
    uncaught exceptions, and every API response with status >= 400 (method, URL, body).
    The UI turns a rejected request into a bare "Oops. Something went wrong." toast; the
    response body says why."""

    def __init__(self, page) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.lines.append(f"page error: {error}"))
        page.on(
            "requestfailed",
            lambda request: self.lines.append(
                f"request failed: {request.method} {request.url}: {request.failure}"
            ),
        )
        page.on("response", self._response)

    def _console(self, message) -> None:  # type: ignore[no-untyped-def]
        if message.type in ("error", "warning"):
            self.lines.append(f"console {message.type}: {message.text}")

    def _response(self, response) -> None:  # type: ignore[no-untyped-def]
        if response.status < 400:
            return
        try:
            body = response.text()
        except Exception as exc:  # the page may have navigated away meanwhile
            body = f"(body unavailable: {exc})"
        self.lines.append(
            f"HTTP {response.status} {response.request.method} {response.url}\n"
            f"  request: {(response.request.post_data or '')[:4000]}\n"
            f"  response: {body[:4000]}"
        )

    def report(self) -> str:
        lines = self.lines or ["(nothing)"]
        return "--- browser console errors and failed requests ---\n" + "\n".join(lines)


def _check_form_shows_model(page) -> None:  # type: ignore[no-untyped-def]
    """The run form is rendered from BuildConfig: each field shows its description, fields
    with defaults show them, and Literal fields are selects offering exactly their values."""
    from playwright.sync_api import expect  # auto-waiting: the form fills in its defaults late

    fields = BuildConfig.model_fields
    for name, title in (
        ("source", "Source"),
        ("size", "Size"),
        ("layout", "Layout"),
        ("resize", "Resize"),
    ):
        shown = " ".join(_field(page, title).locator(".p-label__description").inner_text().split())
        wanted = " ".join(str(fields[name].description).split())
        assert shown[:40] == wanted[:40], f"{title}: description {shown!r}, model {wanted!r}"
    expect(_field(page, "Size").locator("input")).to_have_value(str(fields["size"].default))
    for name, title in (("layout", "Layout"), ("resize", "Resize")):
        select = _field(page, title).locator(".p-select")
        value = select.locator(".p-select-button__value")
        expect(value).to_have_text(str(fields[name].default))
        select.locator("button").focus()
        page.keyboard.press("ArrowDown")  # opens the option list
        options = page.locator(".p-select-option")
        options.first.wait_for()
        offered = [text.strip() for text in options.all_inner_texts()]
        page.keyboard.press("Escape")
        options.first.wait_for(state="hidden")
        assert offered == list(get_args(fields[name].annotation)), f"{title}: {offered}"
        expect(value).to_have_text(str(fields[name].default))  # closing changed nothing


def _dismiss_toasts(page) -> None:  # type: ignore[no-untyped-def]
    # The "Oops" toast never times out and sits over the bottom right, where the button is.
    for close in page.locator(".p-toast__close-btn").all():
        with contextlib.suppress(Exception):
            close.click(timeout=2_000)


def _submit_run_form(page) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Press the form's submit button until the server creates the flow run; return it.

    Only a 503 (SQLite busy: nothing was created, see the module docstring) is answered by
    pressing again; any other status fails with the server's reason.
    """
    for attempt in range(1, SUBMIT_ATTEMPTS + 1):
        with page.expect_response(
            lambda r: r.request.method == "POST" and CREATE_FLOW_RUN.search(r.url) is not None
        ) as created:
            page.locator("button[type=submit]").click()
        response = created.value
        if response.status == 201:
            return dict(response.json())
        if response.status != 503 or attempt == SUBMIT_ATTEMPTS:
            raise AssertionError(
                f"creating the flow run failed (attempt {attempt}): HTTP {response.status} "
                f"{response.text()}"
            )
        print(f"create_flow_run answered 503 (SQLite busy), attempt {attempt}; submitting again")
        _dismiss_toasts(page)
        page.wait_for_timeout(500 * attempt)
    raise AssertionError("unreachable")


def _wait_for_final_state(page, *, timeout_s: float) -> str:  # type: ignore[no-untyped-def]
    """Read the flow run page's state badge until it shows a final state; reload now and
    then in case the page's own polling stalls."""
    badge = page.locator(".state-badge").first
    deadline = time.monotonic() + timeout_s
    next_reload = time.monotonic() + 20
    text = ""
    while time.monotonic() < deadline:
        text = badge.inner_text().strip()
        if text in FINAL_STATES:
            return text
        page.wait_for_timeout(2_000)
        if time.monotonic() > next_reload:
            page.reload()
            next_reload = time.monotonic() + 20
    raise TimeoutError(f"flow run not final after {timeout_s:.0f} s (last badge: {text!r})")


def test_run_form_builds_asset(
    tmp_path: Path, chromium: Path, screenshots: Path, demo_source: str
) -> None:
    from playwright.sync_api import sync_playwright

    destination = tmp_path / "out.h5"
    run_name = f"ui-test-{uuid.uuid4().hex[:8]}"

    with prefect_server(tmp_path) as api_url, served_deployments(api_url, tmp_path) as serve_log:
        ui_url = api_url.removesuffix("/api")
        dep_id = deployment_id(api_url, BUILD_FLOW, "on-demand")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            browser_log = BrowserLog(page)
            try:
                page.goto(f"{ui_url}/deployments/deployment/{dep_id}/run")
                source = _field(page, "Source").locator("textarea")
                source.wait_for()
                page.screenshot(path=screenshots / "01-run-form.png", full_page=True)
                _check_form_shows_model(page)

                page.get_by_text("Run Name").wait_for()
                page.locator("input[type=text]").first.fill(run_name)
                source.fill(demo_source)
                _field(page, "Destination").locator("textarea").fill(str(destination))
                _field(page, "Size").locator("input").fill("32")
                page.screenshot(path=screenshots / "02-form-filled.png", full_page=True)

                flow_run = _submit_run_form(page)
                assert flow_run["name"] == run_name, flow_run
                # Submitting lands on the deployment's page (exactly: the form's own URL,
                # .../run, starts the same), whose run list links the new run by name (the
                # "View run" toast is animated and moves under the pointer).
                page.wait_for_url(re.compile(rf"/deployments/deployment/{dep_id}(?:[?#].*)?$"))
                page.get_by_role("link", name=run_name).first.click()
                page.wait_for_url(f"**/runs/flow-run/{flow_run['id']}**")
                page.get_by_text(run_name).first.wait_for()
                page.screenshot(path=screenshots / "03-flow-run-started.png", full_page=True)

                state = _wait_for_final_state(page, timeout_s=360)
                page.screenshot(path=screenshots / "04-flow-run-final.png", full_page=True)
                page.locator("li.p-tab#artifacts").click()
                page.wait_for_timeout(1_500)
                page.screenshot(path=screenshots / "05-artifacts.png", full_page=True)
            except Exception:
                page.screenshot(path=screenshots / "failure.png", full_page=True)
                print(browser_log.report())
                print(log_tail(server_log(tmp_path), 100))
                print(log_tail(serve_log, 200))
                raise
            finally:
                browser.close()
        assert state == "Completed", f"flow run ended {state}\n{log_tail(serve_log, 200)}"
        runs = httpx.post(
            f"{api_url}/flow_runs/filter",
            json={"flow_runs": {"name": {"any_": [run_name]}}}, timeout=30,
        ).json()  # fmt: skip
        assert [run["id"] for run in runs] == [flow_run["id"]], "one submission, one run"

    assert destination.is_file(), f"{destination} missing after a Completed run"
    assert Path(f"{destination}.manifest.json").is_file()
    assert (screenshots / "04-flow-run-final.png").stat().st_size > 0
