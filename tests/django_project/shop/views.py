"""The order view: the order row and its jobs in one transaction, or none of them."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_project.shop.models import Order
from django_project.shop.tasks import mark_paid, receipt_text


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    """Create an order and enqueue its jobs (pgtasks' ``delay`` and Django's ``enqueue``)
    in ``transaction.atomic()``; ``fail=1`` raises after both, which rolls all back."""
    with transaction.atomic():
        order = Order.objects.create(customer=request.POST["customer"], total=int(request.POST["total"]))
        job = mark_paid.delay(order.pk)
        receipt = receipt_text.enqueue(order.pk)
        if request.POST.get("fail"):
            raise RuntimeError("payment provider unreachable")
    return JsonResponse({"order": order.pk, "job": job.id, "receipt": receipt.id})
