"""Orders with their items inline, as a project's admin would have them."""

from __future__ import annotations

from django.contrib import admin

from django_tests.testapp.models import Order, OrderItem


class OrderItemInline(admin.TabularInline):  # type: ignore[type-arg]
    model = OrderItem
    extra = 1


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    inlines = [OrderItemInline]
    fields = ("note",)
