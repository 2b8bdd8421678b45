"""SheetClaimOperator: claim rows in the sheet first, then create one run per claimed row.

The order is the point. The claim is written to the sheet, the place every future wake-up reads,
before any run exists; each run's id is derived from the row's stable key and the processing
version, so a second attempt to create it (a retry, a second claimer, ``sheet_reconcile``) is
refused by Airflow's metadata database. A refusal is success when the run carries our own claim
token (a retry); when it carries another claim's token, two rows of one URL were claimed (rows
moved under a claimer) and the run works on the other row, so ours is marked DUPLICATE pointing
at it. A crash between the two leaves a claimed row with no run, which ``sheet_reconcile``
repairs; never a run with an unclaimed row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from onceflow.operators.article_step import ArticleStepOperator

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context

    from onceflow.articles.chain import StepRun
    from onceflow.sheets.model import Row
    from onceflow.sheets.protocol import SheetQueue

#: The ``article_pipeline`` DAG each claimed row starts.
ARTICLE_PIPELINE = "article_pipeline"
#: The batch lane's DAG (``dags/article_batch.py``): one run per batch of claims.
ARTICLE_BATCH = "article_batch"


def create_dag_run(
    dag_id: str, run_id: str, conf: dict[str, Any], *, reset: bool = False, note: str | None = None
) -> str:
    """Create a DAG run from inside a running task; return ``"created"`` or ``"exists"``.

    This is what ``TriggerDagRunOperator`` does in Airflow 3 (it raises ``DagRunTriggerException``
    and the task runner sends a ``TriggerDagRun`` message to its supervisor, which calls the
    Execution API); sending the message ourselves lets one task create many runs. A run id that
    already exists comes back as ``DAGRUN_ALREADY_EXISTS`` and is returned as ``"exists"``; whose
    claim that run carries is for the caller to check (:func:`run_claim_token`).

    :param dag_id: the DAG to run.
    :param run_id: the deterministic run id.
    :param conf: the run's conf.
    :param reset: clear the existing run instead (re-drive a finished run under the same id).
    :param note: the run's note (Markdown), shown on the run's page and in the runs list.
    """
    from airflow.sdk.exceptions import ErrorType
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun

    response = task_runner.SUPERVISOR_COMMS.send(
        TriggerDagRun(
            dag_id=dag_id, run_id=run_id, conf=conf, logical_date=None, reset_dag_run=reset, note=note
        )
    )
    if isinstance(response, ErrorResponse):
        if response.error == ErrorType.DAGRUN_ALREADY_EXISTS:
            return "exists"
        raise RuntimeError(
            f"could not create run {run_id!r} of {dag_id!r}: {response.error} {response.detail}"
        )
    return "created"


def claim_note(url: str, row_number: int) -> str:
    """The run note of a claimed row, one line: its URL first (the runs list shows a run by it; the
    run id is an opaque key), then where it was claimed (rows may move later; the run finds its row
    by token). When the run ends, :mod:`onceflow.run_notes` puts the article's title in front."""
    return f"{url} — claimed from row {row_number}"


def run_claim_token(dag_id: str, run_id: str) -> str | None:
    """The claim token in an existing run's conf; ``None`` when there is no such run or its conf
    carries no token (a recheck run). Asked from inside a running task, like :func:`create_dag_run`.
    """
    from onceflow.compat import CAN_READ_OTHER_RUNS, note_degraded

    if not CAN_READ_OTHER_RUNS:  # Airflow 3.1 (compat.DEGRADED["read_other_runs"])
        note_degraded("read_other_runs")
        return None
    from airflow.sdk.api.client import ServerResponseError
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import ErrorResponse, GetDagRun

    try:
        response = task_runner.SUPERVISOR_COMMS.send(GetDagRun(dag_id=dag_id, run_id=run_id))
    except ServerResponseError as err:  # dag.test's in-process supervisor raises what a real one replies
        if err.response.status_code == 404:
            return None
        raise
    if isinstance(response, ErrorResponse):
        if (response.detail or {}).get("status_code") == 404:
            return None
        raise RuntimeError(f"could not read run {run_id!r} of {dag_id!r}: {response.error} {response.detail}")
    token = (getattr(response, "conf", None) or {}).get("claim_token")
    return str(token) if token else None


class SheetClaimOperator(BaseOperator):
    """Claim up to ``max_rows`` NEW rows of the queue sheet, then start one run per claimed row.

    One wake-up (:func:`onceflow.sheets.wakeup.wake_up`): the tab's write-backs pending in the
    ledger's outbox are relayed, then up to ``max_rows`` rows are claimed in one read (a
    ``spreadsheets.get`` bringing the tab id with the values) and one write whatever ``max_rows``
    is, plus a verification read when rows moved; rows found INVALID or DUPLICATE get their status
    through the outbox like every final status (committed, then relayed). Returns, as XCom, the
    claims and what happened to each run.

    :param max_rows: most rows claimed per execution (templated).
    :param processing_version: part of every run id; bump it to process articles again (templated).
    :param gcp_conn_id: the Sheets connection.
    :param spreadsheet_id: the spreadsheet (default: the connection's ``spreadsheet_id`` extra).
    :param sheet: the queue tab (default: the connection's ``sheet`` extra, else ``queue``).
    :param trigger_dag_id: the DAG started per row.
    :param ledger_conn_id: the work ledger; each claimed row becomes a pending ``article`` item
        (after the sheet claim, before its run). ``None`` leaves the ledger out.
    :param batch_size: 0 or 1 (default): one ``trigger_dag_id`` run per claimed row. 2 or more:
        the batch lane, one ``batch_dag_id`` run per batch of up to this many claims whose ledger
        item is new (conf ``claims``; run id ``batch__<first claim token>``, written into each
        item's payload as ``batch_run_id`` before the run exists). A claim whose item existed
        goes alone to ``trigger_dag_id`` as before, or is marked DUPLICATE when a batch at the
        same processing version owns the article under another claim. Needs the ledger; when
        registering fails, every claim goes alone (templated).
    :param batch_dag_id: the batch lane's DAG.
    """

    template_fields: Sequence[str] = (
        "max_rows",
        "processing_version",
        "spreadsheet_id",
        "sheet",
        "batch_size",
    )
    ui_color = "#e8f7e4"

    def __init__(
        self,
        *,
        max_rows: int = 50,
        processing_version: str = "v1",
        gcp_conn_id: str = "onceflow_sheets",
        spreadsheet_id: str | None = None,
        sheet: str | None = None,
        trigger_dag_id: str = ARTICLE_PIPELINE,
        ledger_conn_id: str | None = "onceflow_ledger",
        batch_size: int | str = 0,
        batch_dag_id: str = ARTICLE_BATCH,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("pool", "onceflow_sheets")
        super().__init__(**kwargs)
        self.batch_size = batch_size
        self.batch_dag_id = batch_dag_id
        self.max_rows = max_rows
        self.processing_version = processing_version
        self.gcp_conn_id = gcp_conn_id
        self.spreadsheet_id = spreadsheet_id
        self.sheet = sheet
        self.trigger_dag_id = trigger_dag_id
        self.ledger_conn_id = ledger_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from onceflow.hooks.sheets import SheetQueueHook
        from onceflow.sheets.keys import BATCH_RUN_KEY
        from onceflow.sheets.wakeup import wake_up

        hook = SheetQueueHook(self.gcp_conn_id, spreadsheet_id=self.spreadsheet_id, sheet=self.sheet)
        queue = hook.queue(str(self.processing_version))
        ledger = None
        if self.ledger_conn_id:
            from onceflow.hooks.ledger import LedgerHook

            ledger = LedgerHook(self.ledger_conn_id).get_ledger()
        woke = wake_up(queue, ledger, int(self.max_rows))
        if woke.relayed.relayed or woke.relayed.errors:
            self.log.info(
                "relayed %d write-back(s) (%d rows written, %d left in flight), errors %s",
                woke.relayed.relayed, len(woke.relayed.written), len(woke.relayed.left), woke.relayed.errors,
            )  # fmt: skip
        result = woke.claim
        written = set(woke.rejected.written)
        for rejection in result.rejected:
            self.log.info(
                "row %d %s%s: %s",
                rejection.row_number,
                rejection.status.value,
                "" if rejection.token in written else " (committed; the next relay pass writes it)",
                rejection.reason,
            )
        version = str(self.processing_version)
        confs = {c.token: c.conf(hook.spreadsheet_id, hook.sheet, version) for c in result.claims}
        size = int(self.batch_size or 0)
        batches = self._plan_batches(result.claims, confs, size) if size >= 2 and self.ledger_conn_id else {}
        failures: list[str] = []
        registered: list[str] = []
        if self.ledger_conn_id and result.claims:
            try:
                registered = self._register(self.ledger_conn_id, result.claims, confs)
            except Exception as err:  # the claims stand; the runs still start; sheet_reconcile registers
                self.log.exception("could not register the claims in the ledger")
                failures.append(f"ledger: {err}")
                batches = {}  # not registered: no payload names a batch, so every claim goes alone
        runs: dict[str, str] = {}
        duplicates: list[dict[str, str]] = []
        alone = list(result.claims)
        started: dict[str, list[str]] = {}
        if batches:
            alone = self._start_batches(
                queue, ledger, batches, confs, registered, started, duplicates, failures
            )
            runs.update(dict.fromkeys(started, "created"))
        for claim in alone:
            conf = {k: v for k, v in confs[claim.token].items() if k != BATCH_RUN_KEY}
            try:
                runs[claim.run_id] = create_dag_run(
                    self.trigger_dag_id, claim.run_id, conf, note=claim_note(claim.url, claim.row_number)
                )
                owner = None
                if runs[claim.run_id] == "exists":
                    owner = run_claim_token(self.trigger_dag_id, claim.run_id)
                if owner is not None and owner != claim.token:
                    reason = self._step_aside(queue, ledger, claim, owner)
                    duplicates.append({"claim_token": claim.token, "owner_token": owner, "reason": reason})
            except Exception as err:  # keep going: one refusal must not orphan the other claims
                self.log.exception("could not create run %s", claim.run_id)
                failures.append(f"{claim.run_id}: {err}")
                continue
            self.log.info(
                "row %d (%s): run %s %s", claim.row_number, claim.url, claim.run_id, runs[claim.run_id]
            )
        self.log.info(
            "claimed %d of %d aimed at; %d rejected; sheet calls %s",
            len(result.claims),
            result.aimed,
            len(result.rejected),
            dict(queue.transport.calls),
        )
        if failures:
            # the rows stay claimed; sheet_reconcile creates missing runs and ledger items
            raise RuntimeError(f"claimed {len(result.claims)} row(s), but: {failures}")
        return {
            "ledger_items_created": registered,
            "claims": [
                {"claim_token": c.token, "row_key": c.row_key, "url": c.url, "run_id": c.run_id}
                for c in result.claims
            ],
            "runs": runs,
            "batches": started,
            "rejected": [
                {"claim_token": r.token, "status": r.status.value, "reason": r.reason}
                for r in result.rejected
            ],
            "duplicates": duplicates,
        }

    def _plan_batches(
        self, claims: Sequence[Any], confs: dict[str, dict[str, str]], size: int
    ) -> dict[str, list[Any]]:
        """Claims in order, ``size`` a batch, each batch's run id written into its members' confs
        (and so into their ledger items' payload) before anything is registered."""
        from onceflow.sheets.keys import BATCH_RUN_KEY, batch_run_id

        batches: dict[str, list[Any]] = {}
        for start in range(0, len(claims), size):
            chunk = list(claims[start : start + size])
            run_id = batch_run_id(chunk[0].token)
            for claim in chunk:
                confs[claim.token][BATCH_RUN_KEY] = run_id
            batches[run_id] = chunk
        return batches

    def _start_batches(
        self,
        queue: SheetQueue,
        ledger: Any,
        batches: dict[str, list[Any]],
        confs: dict[str, dict[str, str]],
        registered: Sequence[str],
        started: dict[str, list[str]],
        duplicates: list[dict[str, str]],
        failures: list[str],
    ) -> list[Any]:
        """Create one batch run per batch of the claims whose ledger item is new (``started``: run
        id -> claim tokens); return the claims that go alone (their item existed), minus those
        marked DUPLICATE of a batch."""
        from onceflow.sheets.keys import BATCH_RUN_KEY
        from onceflow.sheets.ledger_link import work_key

        new = set(registered)
        alone: list[Any] = []
        for run_id, chunk in batches.items():
            members = [c for c in chunk if work_key(c.row_key) in new]
            for claim in chunk:
                if claim in members:
                    continue
                owner = batch_owner(ledger, claim.row_key, confs[claim.token])
                if owner is None:
                    alone.append(claim)
                    continue
                reason = self._step_aside(queue, ledger, claim, owner[0])
                duplicates.append({"claim_token": claim.token, "owner_token": owner[0], "reason": reason})
            if not members:
                continue
            claims = [confs[c.token] for c in members]
            note = "\n".join(f"- {c.url} (row {c.row_number})" for c in members)
            try:
                outcome = create_dag_run(
                    self.batch_dag_id,
                    run_id,
                    {"claims": claims},
                    note=f"Batch of {len(members)} claimed rows of the article queue sheet:\n\n{note}",
                )
            except Exception as err:  # the claims stand; sheet_reconcile re-drives them alone
                self.log.exception("could not create batch run %s", run_id)
                failures.append(f"{run_id}: {err}")
                continue
            started[run_id] = [c.token for c in members]
            self.log.info(
                "batch run %s %s: %d article(s) (%s)",
                run_id, outcome, len(members), ", ".join(c.url for c in members),
            )  # fmt: skip
            assert all(confs[c.token][BATCH_RUN_KEY] == run_id for c in members)
        return alone

    def _step_aside(self, queue: SheetQueue, ledger: Any, claim: Any, owner: str) -> str:
        """Mark our row DUPLICATE of the row whose claim the existing run carries; return the reason.

        Two claimers kept one URL (rows moved between one's read and its write, so each won a
        different row of it) and both asked for the same run id; Airflow kept the first conf, so
        the run works on the owner's row and ours must not stay PROCESSING beside it. The
        DUPLICATE leaves as every final status does: committed to the outbox, then relayed (only
        while our row still carries the article's URL).
        """
        from onceflow.sheets.model import Status
        from onceflow.sheets.relay import decided_write, queue_target, send_rows
        from onceflow.sheets.validation import duplicate_reason

        first = queue.locate(owner)  # one small read through the owner's row anchor
        if first is not None:
            reason = duplicate_reason(first)
        else:
            reason = (
                f"duplicate: the article already has run {claim.run_id} (claim {owner}, no longer in "
                "the sheet); use a new processing_version to process it again"
            )
        write = decided_write(
            queue_target(queue), claim.token, Status.DUPLICATE, reason, url=None, row_key=claim.row_key
        )
        report = send_rows(queue, ledger, "sheet_claim", [write])
        if claim.token in report.written:
            self.log.warning(
                "run %s belongs to claim %s: our row %s is DUPLICATE (%s)",
                claim.run_id,
                owner,
                claim.token,
                reason,
            )
        return reason

    def _register(self, conn_id: str, claims: Sequence[Any], confs: dict[str, dict[str, str]]) -> list[str]:
        from onceflow.hooks.ledger import LedgerHook
        from onceflow.sheets.ledger_link import ClaimRecord, register_claims

        ledger = LedgerHook(conn_id).get_ledger()
        records = [ClaimRecord(c.row_key, c.row_number, c.token, confs[c.token]) for c in claims]
        created = register_claims(ledger, records)
        self.log.info("ledger: %d new article item(s) of %d claims", len(created), len(records))
        return created


def batch_owner(ledger: Any, row_key: str, conf: dict[str, str]) -> tuple[str, str] | None:
    """``(claim token, batch run id)`` of the batch that owns the article of ``conf`` at its
    processing version under another claim, or ``None``.

    In the batch lane the article's ledger item, not a per-article run id, is what makes a second
    claim of one article a duplicate: its payload is the conf of the claim that registered it,
    naming its batch run.
    """
    from onceflow.ledger.errors import UnknownWorkItem
    from onceflow.sheets.keys import BATCH_RUN_KEY
    from onceflow.sheets.ledger_link import conf_payload, work_key

    try:
        payload = conf_payload(ledger.item(work_key(row_key)).payload)
    except UnknownWorkItem:
        return None
    batch = payload.get(BATCH_RUN_KEY)
    token = payload.get("claim_token")
    same_version = payload.get("processing_version") == conf.get("processing_version")
    if not batch or not token or token == conf.get("claim_token") or not same_version:
        return None
    return token, batch


class ClaimedRowOperator(ArticleStepOperator):
    """First step of an ``article_pipeline`` run: find the claimed row, check it, record the run.

    The step is a fenced ledger step on the article's item (``article:<row key>``): it leases the
    item, reads the row back by its claim token (through the row anchor: one small read whatever
    the sheet's size), checks that the row still points at the article the run was created for,
    writes the run id beside it, and commits the result under the lease. A retry after the commit
    repeats nothing; a late attempt whose lease was taken over is refused (``StaleFenceError``).
    A row that is gone or points at another article moves the item to ``needs_correction`` with
    the reason, and the task fails without retrying.

    The run's conf comes from ``sheet_claim`` or ``sheet_reconcile`` (claim token, row key, URL,
    spreadsheet, tab, processing version); a recheck run carries only ``work_key`` and
    ``target_version``, and the claim comes from the item's payload with the token of the claim
    that owns the article's run (:func:`onceflow.sheets.ledger_link.owner_claim`).

    Lanes, the hand-back on ``on_kill``, the processing version (the deployed code's, never the
    conf's; an item requiring another version makes the task defer for ``version_wait_seconds``
    and look again, never fail) are :class:`~onceflow.operators.article_step.ArticleStepOperator`'s,
    shared with every step of the chain.
    """

    step = "read_claimed_row"  # onceflow.sheets.ledger_link.CLAIM_STEP
    requires_extra = None  # the sheet queue's own libraries

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("pool", "onceflow_sheets")
        super().__init__(**kwargs)

    def work(self, run: StepRun, context: Context) -> dict[str, Any]:
        return self._read_row(run.conf, run.run_id)

    def _read_row(self, conf: dict[str, Any], run_id: str) -> dict[str, Any]:
        from onceflow.ledger.steps import InvalidInput
        from onceflow.sheets.validation import judge_url

        token = str(conf["claim_token"])
        queue = self.queue_of(conf)

        read: list[Row] = []

        def same_article(row: Row) -> None:
            read.append(row)
            if judge_url(row).key != conf.get("row_key"):
                raise InvalidInput(
                    f"row {row.number} carries token {token!r} but its URL {row.url!r} is not the "
                    f"article this run was created for ({conf.get('url')!r})"
                )

        fields = claimed_row_fields(token, run_id)
        try:
            # the check rides on write_fields' own read: 1 read + 1 write per row, the sheet's
            # per-user quota being what caps articles per minute
            row = queue.write_fields(token, fields, check=same_article)
        except LookupError as exc:
            raise InvalidInput(
                f"no row of the queue carries claim token {token!r}: the claim was removed"
            ) from exc
        # the row as read (the write's echo holds only what it wrote)
        return claimed_row_result(read[-1], row.number, token, run_id)


def claimed_row_fields(token: str, run_id: str) -> dict[str, str]:
    """What ``read_claimed_row`` writes beside a claimed row: the run, the token, the claim time."""
    from onceflow.sheets.model import token_time

    fields = {"run_id": run_id, "claim_token": token}
    claimed_at = token_time(token)
    if claimed_at is not None:
        fields["claimed_at"] = claimed_at.isoformat(timespec="seconds")
    return fields


def claimed_row_result(read: Row, number: int, token: str, run_id: str) -> dict[str, Any]:
    """The committed result of ``read_claimed_row``: the row as read, where it was, whose run."""
    from onceflow.sheets.validation import judge_url

    verdict = judge_url(read)
    return {
        "row_number_at_read": number,
        "url": verdict.normalised_url,
        "row_key": verdict.key,
        "status": read.status_cell.raw,
        "claim_token": token,
        "run_id": run_id,
    }


def read_claimed_rows(
    queue: SheetQueue, confs: Sequence[dict[str, Any]], run_id: str
) -> dict[str, dict[str, Any]]:
    """``read_claimed_row``'s sheet work for many claims of one queue: one read of every row by
    its anchor, then one write of :func:`claimed_row_fields` beside each row that still carries
    its token and names its article (2 requests, where one claim at a time costs 2 each).

    Returns claim token -> the result to commit, for the rows settled so; a claim left out (its
    row is gone or moved to another article, an anchor sits on a row that lost the token, the
    echo of the write does not show the token) goes the one-claim way
    (:meth:`AnchoredRows.write_fields`), which repairs or refuses it with its reason.
    """
    from onceflow.sheets import anchors
    from onceflow.sheets.model import make_row
    from onceflow.sheets.validation import judge_url

    tokens = [str(c["claim_token"]) for c in confs]
    columns, rows = queue.anchored_rows(tokens)
    if columns is None:
        return {}
    read: dict[str, Row] = {}
    updates: list[tuple[str, dict[str, str]]] = []
    for conf, token in zip(confs, tokens, strict=True):
        found = rows.get(token, [])
        if len(found) != 1 or found[0].token != token or judge_url(found[0]).key != conf.get("row_key"):
            continue
        read[token] = found[0]
        wanted = {k: v for k, v in claimed_row_fields(token, run_id).items() if columns.has(k)}
        if any(found[0].get(k) != v for k, v in wanted.items()):
            updates.append((token, wanted))
    echoed: dict[str, int] = {}
    if updates:
        reply = queue.write_anchored(columns, updates)
        for response in reply.get("responses", []):
            token = str(
                response.get("dataFilter", {}).get("developerMetadataLookup", {}).get("metadataValue", "")
            )
            data = response.get("updatedData", {})
            values = data.get("values", [])
            number = anchors.row_number(data.get("range", response.get("updatedRange", "")))
            if number is not None and make_row(columns, number, values[0] if values else []).token == token:
                echoed[token] = number
    written = {t for t, _ in updates}
    return {
        token: claimed_row_result(row, echoed.get(token, row.number), token, run_id)
        for token, row in read.items()
        if token not in written or token in echoed
    }
