"""Requests, queue policies and the scheduler."""

from .request import MultiModalFeature, Request, RequestStatus, RequestTimes

__all__ = ["MultiModalFeature", "Request", "RequestStatus", "RequestTimes"]
