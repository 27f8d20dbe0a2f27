"""Routing: pure, synchronous decisions about where a request runs."""

from routing.compliance import Excluded
from routing.decide import Candidate, Rejection, RouteDecision, Router, decide
from routing.features import FeatureError, RequestFeatures, build_features
from routing.pii import PiiFinding, PiiScanner
from routing.predict import Prediction, TargetModel, predict
from routing.stats import LiveStats, PredictionError, StatsSnapshot, TargetSnapshot
from routing.tokens import TokenCounter

__all__ = [
    "Candidate",
    "Excluded",
    "FeatureError",
    "LiveStats",
    "PiiFinding",
    "PiiScanner",
    "Prediction",
    "PredictionError",
    "Rejection",
    "RequestFeatures",
    "RouteDecision",
    "Router",
    "StatsSnapshot",
    "TargetModel",
    "TargetSnapshot",
    "TokenCounter",
    "build_features",
    "decide",
    "predict",
]
