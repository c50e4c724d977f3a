"""The test project's URLs: the admin and the order view."""

from django.contrib import admin
from django.urls import path

from django_project.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.create_order),
]
