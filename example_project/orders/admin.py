from django.contrib import admin

from example_project.orders.models import Invoice, Order, Shipment


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "number", "reference", "customer", "total_cents", "created_at")
    search_fields = ("customer", "number", "reference")


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("number", "order", "total_cents")
    search_fields = ("number",)


@admin.register(Shipment)
class ShipmentAdmin(admin.ModelAdmin):
    list_display = ("id", "order", "carrier")
