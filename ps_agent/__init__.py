"""ParallelSearch: LLM search agents that split questions into parallel sub-queries (LangGraph plugin)."""

from ps_agent.agent import ParallelSearchAgent
from ps_agent.configuration import AgentConfig
from ps_agent.graph import AgentError
from ps_agent.retrieval import Passage, Retriever

__all__ = ["AgentConfig", "AgentError", "ParallelSearchAgent", "Passage", "Retriever"]
__version__ = "0.1.0"
