"""An order row, written by the view in the same transaction as its jobs."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """A customer's order."""

    customer: models.CharField[str, str] = models.CharField(max_length=100)
    total: models.IntegerField[int, int] = models.IntegerField()
    paid: models.BooleanField[bool, bool] = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"order {self.pk} of {self.customer}"
