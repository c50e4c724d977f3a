"""Tasks of the test project, both ways: pgtasks' ``@app.task`` and Django's ``@task``.

Imported at start-up by pgtasks' autodiscovery, in the web process and the worker alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_project.shop.models import Order
from pgtasks.contrib.django import app

if TYPE_CHECKING:
    from django_tasks import TaskContext, task
else:
    try:
        from django.tasks import TaskContext, task
    except ImportError:  # Django before 6.0: the django-tasks package
        from django_tasks import TaskContext, task


@app.task(queue="default")
def mark_paid(order_id: int) -> int:
    """Mark the order paid; returns how many rows changed (pgtasks' own task API)."""
    changed: int = Order.objects.filter(pk=order_id).update(paid=True)
    return changed


@app.task(queue="emails", max_retries=0)
def charge_card(order_id: int, password: str) -> None:
    """A task with a secret argument, for the admin's masking."""
    raise RuntimeError(f"card declined for order {order_id}")


@task(queue_name="emails")
def receipt_text(order_id: int) -> str:
    """Django's task API: the receipt of an order, read from the database by the worker."""
    order = Order.objects.get(pk=order_id)
    return f"{order.customer} paid {order.total}"


@task(priority=10)
def add(a: int, b: int) -> int:
    """Django's task API, no database."""
    return a + b


@task()
def explode(message: str) -> None:
    """Django's task API: a task that fails."""
    raise ValueError(message)


@task(takes_context=True)
def whoami(context: TaskContext, label: str) -> dict[str, Any]:
    """Django's task API with the context: the result id and attempt it ran as."""
    return {"label": label, "id": context.task_result.id, "attempt": context.attempt}


@task()
async def shout(text: str) -> str:
    """Django's task API, a coroutine."""
    return text.upper()
