from single_controller.base.worker import Worker

__all__ = ["Worker"]
