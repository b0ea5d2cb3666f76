// A host in plain Node.js (18+: global fetch, no npm packages) driving `lamina serve`.
// Its notes live on the client: each turn sends their contents, and Lamina treats them
// exactly as vault notes. Usage: node examples/js/client.mjs http://127.0.0.1:8765 [TOKEN]
// Prints one JSON line with what it checked; exits 1 on the first failed check.

const [base, token] = process.argv.slice(2);
if (!base) {
  console.error("usage: node client.mjs BASE_URL [TOKEN]");
  process.exit(2);
}

async function call(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(base + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${data.error}`);
  return data;
}

function check(condition, what) {
  if (!condition) {
    console.error(`check failed: ${what}`);
    process.exit(1);
  }
}

// The client's files: two notes, one linking the other.
const notes = {
  "plan.md": "# Plan\n\nShip the sync service. See [[risks]].\n",
  "risks.md": "# Risks\n\n- Conflicting edits on two devices.\n",
};
const sent = () => Object.entries(notes).map(([path, content]) => ({ path, content }));

const conversation = await call("POST", "/v1/conversations", {
  system: "You are terse.",
  vault: false,
  provider: "anthropic",
});
check(conversation.defer_library === true, "the library's growth is deferred by default");
let head = conversation.head;

// Turn 1: the plan note goes to the user message in full.
let turn = await call("POST", `/v1/conversations/${conversation.id}/turns`, {
  parent: head,
  user: "Summarize the plan",
  attach: [{ note: "plan.md" }],
  notes: sent(),
});
check(turn.turn === 1, "turn 1 is numbered 1");
check(turn.messages.at(-1).content.includes("Ship the sync service."), "turn 1 sends the plan");
check(turn.request.system !== undefined, "turn 1 has an Anthropic request");
head = (await call("POST", `/v1/conversations/${conversation.id}/reply`, {
  parent: turn.head,
  text: "Ship sync; risks are listed.",
})).head;

// Turn 2: the plan stays in turn 1's user message (the library's growth waits for the
// next prefix break, so this request extends turn 1's byte for byte); risks is new.
turn = await call("POST", `/v1/conversations/${conversation.id}/turns`, {
  parent: head,
  user: "And the risks?",
  attach: [{ note: "plan.md" }, { note: "risks.md" }],
  notes: sent(),
});
const system2 = turn.messages[0].content;
check(turn.messages[1].content.includes("Ship the sync service."), "turn 2 keeps the plan where it was sent");
check(turn.messages.at(-1).content.includes("Conflicting edits"), "turn 2 sends the risks");
check(turn.cache.break_reason === null, "turn 2 keeps the cached prefix");
head = (await call("POST", `/v1/conversations/${conversation.id}/reply`, {
  parent: turn.head,
  text: "Conflicting edits.",
})).head;

// Turn 3: the risks note was edited on the client; the library keeps its bytes (pin).
notes["risks.md"] = "# Risks\n\n- Conflicting edits on two devices.\n- Clock skew.\n";
turn = await call("POST", `/v1/conversations/${conversation.id}/turns`, {
  parent: head,
  user: "Anything new?",
  attach: [{ note: "risks.md" }],
  notes: sent(),
});
check(turn.messages[0].content.startsWith(system2), "turn 3's system message extends turn 2's");
check(turn.messages.at(-1).content.includes("Clock skew."), "turn 3 sends the edited note");
check(turn.head.turn === 3, "the head is turn 3");

// A stale head is refused with the current one.
const stale = await fetch(`${base}/v1/conversations/${conversation.id}/turns`, {
  method: "POST",
  headers: {
    "Content-Type": "application/json",
    ...(token ? { Authorization: `Bearer ${token}` } : {}),
  },
  body: JSON.stringify({ parent: head, user: "late" }),
});
const refused = await stale.json();
check(stale.status === 409 && refused.head.turn === 3, "a stale head gets 409 and the head");

const transcript = await call("GET", `/v1/conversations/${conversation.id}/transcript`);
check(transcript.markdown.includes("Anything new?"), "the transcript has turn 3");
console.log(
  JSON.stringify({ conversation: conversation.id, turns: turn.turn, head: turn.head.hash })
);
