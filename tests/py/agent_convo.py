"""The agent conversation both client scripts send (agent_clients.py against a worker,
proxy_agent_clients.py through the proxy): a user turn, an assistant text and tool
call, the tool's result, and the tool's schema."""


def conversation(prompt):
    """The Messages API conversation: PROMPT, then one tool round trip."""
    return [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": [
            {"type": "text", "text": "t5 t6"},
            {"type": "tool_use", "id": "tu_1", "name": "ls", "input": {"path": "/"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu_1", "content": "t7 t8"},
            {"type": "text", "text": "t9"}]},
    ]


TOOLS = [{"name": "ls", "description": "list",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
