"""A tool-using agent for the `multiply` task, written against the `openai` client alone.

It asks the model for the product, offers it a `multiply` calculator tool, runs the tool calls
the model makes and returns the model's final answer, which the task's reward scores. Nothing
here imports the training project: the same function runs against any OpenAI-compatible
endpoint (`trainer serve`, vLLM, a hosted model).

Train it (docs/agents.md):

    trainer train --algo grpo model.path=MODEL_DIR task.name=multiply \\
        rollout.agent=examples/agents/multiply_agent.py:agent rollout.environment=null rollout.engine=paged
"""

import json

MODEL = "policy"  # the trainer's endpoint serves one model, whatever it is called
SYSTEM = "You multiply numbers. Call the multiply tool, then answer with the product alone."
TOOLS = [{
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "The product of two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}]
MAX_STEPS = 3


def multiply(arguments: str) -> str:
    """The tool: a * b for two integers of at most 12 digits, or an error line (the model's text is untrusted)."""
    try:
        args = json.loads(arguments)
        a, b = int(args["a"]), int(args["b"])
    except (ValueError, TypeError, KeyError):
        return 'error: expected {"a": integer, "b": integer}'
    if max(abs(a), abs(b)) >= 10**12:
        return "error: numbers too large"
    return str(a * b)


async def agent(client, row):
    """`row["prompt"]` is the task's question (e.g. "123*456="); returns the final answer's text."""
    question = row["prompt"].rstrip("=")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {question}?"}]
    reply = None
    for _ in range(MAX_STEPS):
        out = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=48)
        reply = out.choices[0].message
        if not reply.tool_calls:
            return reply.content or ""
        messages.append({"role": "assistant", "content": reply.content or "", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in reply.tool_calls]})
        for call in reply.tool_calls:
            result = multiply(call.function.arguments) if call.function.name == "multiply" else "error: unknown tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return (reply.content or "") if reply is not None else ""
