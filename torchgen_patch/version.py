"""The version of torchgen-patch (one place; everything else imports it from here)."""

__version__ = "0.1.0"
