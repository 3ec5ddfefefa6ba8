"""The use cases of `infrastructure.service.ProvisioningService`, one module each group."""
