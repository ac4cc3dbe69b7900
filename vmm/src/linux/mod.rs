//! Linux guests: kernel loading, boot parameters, e820, ACPI.
