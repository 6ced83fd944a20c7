"""An app that moved from BigAutoField to SequenceAutoField with one setting."""

from django.apps import AppConfig


class SwitchConfig(AppConfig):
    name = "django_tests.switch"
    default_auto_field = "autoseq_django.fields.SequenceAutoField"
