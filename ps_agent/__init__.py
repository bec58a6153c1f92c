"""ParallelSearch: LLM search agents that split questions into parallel sub-queries (LangGraph plugin)."""

from ps_agent.agent import ParallelSearchAgent
from ps_agent.configuration import AgentConfig
from ps_agent.graph import AgentError
from ps_agent.retrieval import Passage, Retriever
from ps_agent.serving import ChoiceError, Choices

__all__ = ["AgentConfig", "AgentError", "ChoiceError", "Choices", "ParallelSearchAgent", "Passage", "Retriever"]
__version__ = "0.1.0"
