"""Workflows of jobs with Celery's names: `chain`, `group` and `chord` (its "canvas").

A workflow is built from signatures (``task.s(...)``, ``task.si(...)``) and enqueued
by ``apply_async`` in ONE transaction, the caller's with ``connection=``: every job
of it is written, or none. The jobs after the first of a chain and a chord's callback
are written ``blocked``, waiting for their prerequisites (``depends_on``, migration
0007); the database queues each one in the transaction that finishes its last
prerequisite, with the results it asked for prepended to its arguments (a partial
signature gets the previous job's result; a chord's callback the list of the
header's results, in header order). No worker passes results on, and nothing polls.

Failure rules (as ``depends_on``'s): a job whose prerequisite fails for good or is
cancelled is cancelled (error code ``DEPENDENCY_FAILED``), and so are the jobs that
wait for it. See docs/workflows.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from pgtasks.enqueue import check_connection, prerequisite_ids
from pgtasks.errors import ConfigurationError, ResultTimeout
from pgtasks.result import AsyncResult
from pgtasks.task import Signature
from pgtasks.validation import check_bool, check_timeout, short

if TYPE_CHECKING:
    from pgtasks.db import AnyConnection

__all__ = ["GroupResult", "chain", "chord", "group"]

# How the next step of a workflow gets the results of the steps before it: not at all
# (the first step, or prerequisites given with depends_on=), each result prepended (after
# one job), or one list of them (after a group: a chord).
_Passing = Literal["none", "each", "list"]

#: Most jobs one workflow may hold.
MAX_WORKFLOW_JOBS: Final = 10_000


def _parts(tasks: tuple[Any, ...], label: str) -> list[Any]:
    """The parts of ``chain(*tasks)`` / ``group(*tasks)``: the arguments, or the items of
    a single iterable argument (``group(ocr.s(i) for i in ids)``), each checked.

    Raises:
        ConfigurationError: a part that is not a signature, chain, group or chord.
    """
    if len(tasks) == 1 and not isinstance(tasks[0], _NODE_TYPES) and isinstance(tasks[0], Iterable):
        tasks = tuple(tasks[0])
    for part in tasks:
        if not isinstance(part, _NODE_TYPES):
            raise ConfigurationError(
                f"{label} takes signatures (task.s(...)), chains, groups and chords, got {short(part)}"
            )
    return list(tasks)


class _Workflow:
    """What `chain`, `group` and `chord` share: enqueue in one transaction."""

    def _first_signature(self) -> Signature:
        for sig in self._signatures():
            return sig
        raise ConfigurationError(f"an empty {type(self).__name__} has no job to enqueue")

    def _signatures(self) -> Iterator[Signature]:
        raise NotImplementedError

    def _with_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def _apply(
        self, args: Iterable[Any] | None, kwargs: Mapping[str, Any] | None, options: dict[str, Any]
    ) -> Any:
        """Enqueue the workflow in one transaction; returns what `_Builder.add` returns first."""
        connection = options.pop("connection", None)
        conn = check_connection(connection)
        node: Any = self._with_args(tuple(args or ()), dict(kwargs or {})) if (args or kwargs) else self
        after = prerequisite_ids(options.pop("depends_on", None))
        count = sum(1 for _ in node._signatures())
        if count > MAX_WORKFLOW_JOBS:
            raise ConfigurationError(f"a workflow holds at most {MAX_WORKFLOW_JOBS} jobs, this one {count}")
        app = self._first_signature().task.app
        with app.stores.database.transaction(conn) as tx:
            builder = _Builder(tx, options)
            result, _, _ = builder.add(node, after, "none")
        return result

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """``apply_async(args, kwargs)``."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Any:
        raise NotImplementedError


class chain(_Workflow):
    """Jobs that run one after the other, each once the one before has succeeded.

    ``chain(ocr.s(42), taxonomy.s(), index.s())``: ``taxonomy`` gets ``ocr``'s result
    as its first argument, ``index`` gets ``taxonomy``'s (an immutable ``task.si(...)``
    gets nothing). A group in a chain runs its jobs side by side; the step after it is
    a chord's callback and gets the list of their results. ``a | b | c`` builds the same.

    Args:
        tasks: signatures, chains, groups and chords, or one iterable of them.

    Raises:
        ConfigurationError: a part of another kind.
    """

    def __init__(self, *tasks: Any) -> None:
        self.tasks: list[Any] = _parts(tasks, "chain")

    def __repr__(self) -> str:
        return " | ".join(repr(t) for t in self.tasks) or "chain()"

    def __or__(self, other: Any) -> chain:
        """This chain with ``other`` appended (a chain's steps are spliced in)."""
        if isinstance(other, chain):
            return chain(*self.tasks, *other.tasks)
        return chain(*self.tasks, *_parts((other,), "chain"))

    def _signatures(self) -> Iterator[Signature]:
        for part in self.tasks:
            yield from _signatures_of(part)

    def _with_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> chain:
        if not self.tasks:
            return self
        return chain(_with_args(self.tasks[0], args, kwargs), *self.tasks[1:])

    def apply_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> AsyncResult:
        """Enqueue every job of the chain in one transaction.

        Args:
            args, kwargs: prepended to / merged into the first step's arguments.
            options: enqueue options for every job that its own signature does not set
                (``queue``, ``priority``, ``tenant``, ...), ``connection`` (the caller's
                psycopg connection: the whole chain commits or rolls back with it), and
                ``depends_on`` (jobs the first step waits for; their results are not
                passed).

        Returns:
            The last step's `AsyncResult` (a group's: `GroupResult`); ``.parent`` leads
            back to the steps before it.

        Raises:
            ConfigurationError: an empty chain, an invalid option or argument.
            JobNotFound: a ``depends_on`` id names no job of the tenant.
            SerializationError, AlreadyQueued, DatabaseError: as `pgtasks.Task.apply_async`.
            In every case nothing of the chain is written.
        """
        result: AsyncResult = self._apply(args, kwargs, dict(options))
        return result


class group(_Workflow):
    """Jobs that run side by side; ``apply_async`` returns a `GroupResult`.

    Args:
        tasks: signatures, chains, groups and chords, or one iterable of them
            (``group(ocr.s(i) for i in ids)``).

    Raises:
        ConfigurationError: a part of another kind.
    """

    def __init__(self, *tasks: Any) -> None:
        self.tasks: list[Any] = _parts(tasks, "group")

    def __repr__(self) -> str:
        return f"group({', '.join(repr(t) for t in self.tasks)})"

    def __or__(self, other: Any) -> Any:
        """``group | signature`` is a chord (as in Celery); anything else a chain."""
        if isinstance(other, Signature):
            return chord(self, other)
        return chain(self) | other

    def __len__(self) -> int:
        return len(self.tasks)

    def _signatures(self) -> Iterator[Signature]:
        for part in self.tasks:
            yield from _signatures_of(part)

    def _with_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> group:
        return group(*(_with_args(t, args, kwargs) for t in self.tasks))

    def apply_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> GroupResult:
        """Enqueue every job of the group in one transaction.

        Args:
            args, kwargs: prepended to / merged into every member's arguments.
            options: as `chain.apply_async`.

        Returns:
            A `GroupResult` of the members' results, in order.

        Raises:
            ConfigurationError, JobNotFound, SerializationError, AlreadyQueued,
                DatabaseError: as `chain.apply_async` (nothing written).
        """
        if not self.tasks:
            return GroupResult([])
        result: GroupResult = self._apply(args, kwargs, dict(options))
        return result


class chord(_Workflow):
    """A group (the header) and a callback (the body) that runs once every job of the
    header has succeeded, with the list of their results, in header order, as its
    first argument (none for an immutable ``task.si(...)``).

    ``chord(header, body)``, or Celery's ``chord(header)(body)``; a list of signatures
    is taken as a group.

    Raises:
        ConfigurationError: a header or body of another kind.
    """

    def __init__(self, header: Any, body: Any = None) -> None:
        self.header: group = header if isinstance(header, group) else group(header)
        if body is not None and not isinstance(body, _NODE_TYPES):
            raise ConfigurationError(
                f"a chord's body is a signature, chain, group or chord, got {short(body)}"
            )
        self.body: Any = body

    def __repr__(self) -> str:
        return f"chord({self.header!r}, {self.body!r})"

    def __call__(self, body: Any = None, **options: Any) -> AsyncResult:
        """Celery's ``chord(header)(body)``: enqueue with this body."""
        return chord(self.header, body if body is not None else self.body).apply_async(**options)

    def __or__(self, other: Any) -> chain:
        """``chord | x``: a chain of the chord and ``x``."""
        return chain(self, *_parts((other,), "chain"))

    def _signatures(self) -> Iterator[Signature]:
        yield from self.header._signatures()
        if self.body is not None:
            yield from _signatures_of(self.body)

    def _with_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> chord:
        return chord(self.header._with_args(args, kwargs), self.body)

    def apply_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> AsyncResult:
        """Enqueue the header's jobs and the body in one transaction.

        Args:
            args, kwargs: prepended to / merged into every header member's arguments.
            options: as `chain.apply_async`.

        Returns:
            The body's `AsyncResult`; its ``.parent`` is the header's `GroupResult`.

        Raises:
            ConfigurationError: no body, or as `chain.apply_async` (nothing written).
            JobNotFound, SerializationError, AlreadyQueued, DatabaseError: as
                `chain.apply_async` (nothing written).
        """
        if self.body is None:
            raise ConfigurationError("a chord needs a body: chord(header, body) or chord(header)(body)")
        result: AsyncResult = self._apply(args, kwargs, dict(options))
        return result


_NODE_TYPES: Final = (Signature, chain, group, chord)


def _signatures_of(part: Any) -> Iterator[Signature]:
    if isinstance(part, Signature):
        yield part
    else:
        yield from part._signatures()


def _with_args(part: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if isinstance(part, Signature):
        return part.clone(args, kwargs)
    return part._with_args(args, kwargs)


class _Builder:
    """Writes a workflow's jobs, part by part, in one transaction ``tx``.

    Each part is written after the jobs it waits for (``after``), which is how a
    cycle cannot be built: a job can only name jobs already written.
    """

    def __init__(self, tx: AnyConnection, options: Mapping[str, Any]) -> None:
        self.tx = tx
        self.defaults = {k: v for k, v in options.items() if k != "connection"}

    def add(self, part: Any, after: list[int], passing: _Passing) -> tuple[Any, list[int], _Passing]:
        """Write ``part`` to run after the jobs ``after``, getting their results as
        ``passing`` says; returns (its result, the jobs a next step waits for, how
        that step gets their results)."""
        if isinstance(part, Signature):
            result = self._signature(part, after, passing)
            return result, [result.id], "each"
        if isinstance(part, chain):
            last: Any = None
            for step in part.tasks:
                previous = last
                last, after, passing = self.add(step, after, passing)
                if (
                    previous is not None
                    and isinstance(last, AsyncResult | GroupResult)
                    and last.parent is None
                ):
                    last.parent = previous
            return last, after, passing
        if isinstance(part, group):
            results: list[Any] = []
            tails: list[int] = []
            for member in part.tasks:
                r, t, _ = self.add(member, after, passing)
                results.append(r)
                tails.extend(t)
            return GroupResult(results), tails, "list"
        assert isinstance(part, chord)
        header, tails, _ = self.add(part.header, after, passing)
        body, after, passing = self.add(part.body, tails, "list")
        if isinstance(body, AsyncResult | GroupResult) and body.parent is None:
            body.parent = header
        return body, after, passing

    def _signature(self, sig: Signature, after: list[int], passing: _Passing) -> AsyncResult:
        args = tuple(sig.args)
        options: dict[str, Any] = {**self.defaults, **sig.options, "connection": self.tx}
        mode: _Passing = "none" if sig.immutable else passing
        if mode == "list" and not after:
            args = ([], *args)  # a chord over an empty group: the callback gets []
            mode = "none"
        if after:
            options["depends_on"] = after
            options["_pass_results"] = mode
            options["_prepended"] = {"none": 0, "each": len(after), "list": 1}[mode]
        task = sig.task
        return task.app.enqueue(task, args, dict(sig.kwargs), options)


class GroupResult:
    """The results of a group's jobs, in the group's order (Celery's ``GroupResult``).

    Args:
        results: one `AsyncResult` (or nested `GroupResult`) per member.

    Attributes:
        results: as given. parent: the step before the group in a chain, or None.
    """

    def __init__(self, results: Sequence[Any]) -> None:
        self.results: list[Any] = list(results)
        self.parent: Any = None

    def __repr__(self) -> str:
        return f"<GroupResult {self.ids}>"

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __getitem__(self, index: int) -> Any:
        return self.results[index]

    @property
    def ids(self) -> list[int]:
        """The job ids, in order (a nested group's flattened)."""
        return [i for r in self.results for i in (r.ids if isinstance(r, GroupResult) else [r.id])]

    @property
    def children(self) -> list[Any]:
        """Celery's name for `results`."""
        return self.results

    def _leaves(self) -> Iterator[AsyncResult]:
        for r in self.results:
            if isinstance(r, GroupResult):
                yield from r._leaves()
            else:
                yield r

    def ready(self) -> bool:
        """Whether every job has finished (any terminal status)."""
        return all(r.ready() for r in self._leaves())

    def successful(self) -> bool:
        """Whether every job has succeeded."""
        return all(r.successful() for r in self._leaves())

    def failed(self) -> bool:
        """Whether some job has ended without success."""
        return any(r.failed() for r in self._leaves())

    def completed_count(self) -> int:
        """How many jobs have succeeded."""
        return sum(1 for r in self._leaves() if r.successful())

    def get(self, timeout: float | None = None, *, propagate: bool = True) -> list[Any]:
        """Wait for every job and return their results, in order.

        Args:
            timeout: seconds to wait at most for all of them together (None: forever).
            propagate: raise the first failure met (True) or put it in the list.

        Raises:
            ConfigurationError: a bad ``timeout`` or ``propagate``.
            ResultTimeout: not all had finished within ``timeout``.
            TaskFailed: a job failed (with ``propagate``).
        """
        import time

        seconds = check_timeout("timeout", timeout)
        check_bool("propagate", propagate)
        deadline = None if seconds is None else time.monotonic() + seconds
        out: list[Any] = []
        for r in self.results:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out.append(r.get(timeout=left, propagate=propagate))
            except ResultTimeout:
                raise ResultTimeout(f"group {self.ids}: not every job finished in time") from None
        return out

    join = get  # Celery's other name

    def revoke(self, *, terminate: bool = False) -> int:
        """Cancel every job that has not finished (blocked and queued ones at once,
        running ones asked to stop); returns how many were still unfinished."""
        return sum(1 for r in self._leaves() if r.revoke(terminate=terminate))

    def statuses(self) -> list[str]:
        """Each job's status, in order (flattened)."""
        return [r.status for r in self._leaves()]
