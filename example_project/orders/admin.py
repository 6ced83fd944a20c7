from django.contrib import admin

from example_project.orders.models import Order, Shipment


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "number", "customer", "total_cents", "created_at")
    search_fields = ("customer", "number")


@admin.register(Shipment)
class ShipmentAdmin(admin.ModelAdmin):
    list_display = ("id", "order", "carrier")
