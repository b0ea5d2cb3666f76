"""Memory: recalled history passages, their index and the built-in rankers."""

from lamina.pipeline._model.recall import Recalled, RecallItem
from lamina.pipeline._recall.memory import RecallMemo
from lamina.pipeline._recall.retrievers import Bm25Retriever, Fts5Retriever

__all__ = ["Bm25Retriever", "Fts5Retriever", "RecallItem", "RecallMemo", "Recalled"]
