// Threadloom's GraphiQL: the token typed above the IDE is kept in sessionStorage (this tab only, gone when it
// closes, never localStorage) and sent as `Authorization: Bearer …`; subscriptions stream over server-sent
// events (graphql-sse, `Accept: text/event-stream`), queries and mutations are plain POSTs.
(function () {
  "use strict";
  var KEY = "threadloom.token";
  var endpoint = window.location.pathname;

  var EXAMPLES = [
    {
      query:
        "# Who am I? The token's scope and, for a project token, its project.\n" +
        "query Viewer {\n  viewer {\n    scope\n    project { id name }\n  }\n}\n",
    },
    {
      query:
        "# Projects and their latest threads.\n" +
        "query Projects {\n  projects(first: 10) {\n    nodes {\n      id\n      name\n      workspaceRoot\n" +
        "      threads(first: 5) { nodes { id title status } }\n    }\n  }\n}\n",
    },
    {
      query:
        "# A thread in a project (its id from the Projects tab), then a message to it.\n" +
        "mutation CreateThread($projectId: ID!) {\n  createThread(input: {projectId: $projectId, title: \"From GraphiQL\"}) {\n" +
        "    thread { id title }\n    userErrors { code message field }\n  }\n}\n\n" +
        "mutation SendMessage($threadId: ID!) {\n  sendMessage(input: {threadId: $threadId, text: \"@reply hello\"}) {\n" +
        "    run { id status }\n    userErrors { code message field }\n  }\n}\n",
      variables: '{\n  "projectId": "",\n  "threadId": ""\n}\n',
    },
    {
      query:
        "# A thread's events, replayed from the start, then live (server-sent events).\n" +
        "subscription ThreadEvents($threadId: ID!) {\n  threadEvents(threadId: $threadId, afterSequence: 0) {\n" +
        "    sequence\n    type\n    runId\n    entity { __typename ... on ConversationMessage { role text } }\n  }\n}\n",
      variables: '{\n  "threadId": ""\n}\n',
    },
  ];

  function token() {
    return window.sessionStorage.getItem(KEY) || "";
  }

  // The operations of a document's text, [{type, name}] (name null: anonymous), comments and strings left out.
  // Read from the text sent, not from what GraphiQL hands the fetcher: its operation name and parsed document
  // are those of its last parse, made 100 ms after an edit, so a run right after switching tabs sent the new
  // tab's text under the old tab's name ("Unknown operation named Viewer") and chose SSE by the old document.
  function operationsOf(text) {
    var bare = String(text).replace(/"""[\s\S]*?"""|"(?:[^"\\\n]|\\.)*"|#[^\n]*/g, " ");
    var token = /[{}()]|[_A-Za-z][_0-9A-Za-z]*/g;
    var found = [], braces = 0, parens = 0, head = null, match; // head: the definition whose body comes next
    while ((match = token.exec(bare))) {
      var word = match[0];
      if (word === "(") parens++;
      else if (word === ")") parens--;
      else if (parens > 0) continue; // variables and their default values
      else if (word === "}") braces--;
      else if (word === "{") {
        if (braces === 0 && head === null) found.push({ type: "query", name: null }); // `{ … }` alone
        else if (braces === 0 && head.type !== "fragment" && !head.named) found.push({ type: head.type, name: null });
        if (braces === 0) head = null;
        braces++;
      } else if (braces > 0) continue;
      else if (head === null && /^(query|mutation|subscription|fragment)$/.test(word)) {
        head = { type: word, named: false };
      } else if (head !== null && !head.named) {
        head.named = true;
        if (head.type !== "fragment") found.push({ type: head.type, name: word });
      }
    }
    return found;
  }

  // The operation a run means: the one named, else the document's only one (the name left out: a stale name
  // would be refused).
  function chosenOperation(params) {
    var ops = operationsOf(params.query || "");
    var named = ops.find(function (o) { return o.name !== null && o.name === params.operationName; });
    if (named) return { params: params, type: named.type };
    if (ops.length === 1) {
      var only = Object.assign({}, params, { operationName: ops[0].name || undefined });
      return { params: only, type: ops[0].type };
    }
    return { params: params, type: "query" }; // several and none named: the server says which is missing
  }
  window.threadloomGraphiql = { operationsOf: operationsOf, chosenOperation: chosenOperation }; // for tests

  async function* events(response) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffer = "";
    for (;;) {
      var read = await reader.read();
      if (read.done) return;
      buffer += decoder.decode(read.value, { stream: true }).replace(/\r\n/g, "\n");
      var end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        var block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        var name = "message";
        var data = [];
        block.split("\n").forEach(function (line) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        });
        if (name === "complete") {
          reader.cancel();
          return;
        }
        if (name === "next" && data.length) yield JSON.parse(data.join("\n"));
      }
    }
  }

  function makeFetcher() {
    return async function fetcher(params, opts) {
      var headers = { "content-type": "application/json" };
      var own = (opts && opts.headers) || {};
      Object.keys(own).forEach(function (k) { headers[k.toLowerCase()] = own[k]; });
      if (token() && !headers.authorization) headers.authorization = "Bearer " + token();
      var chosen = chosenOperation(params);
      params = chosen.params;
      var streaming = chosen.type === "subscription";
      headers.accept = streaming ? "text/event-stream" : "application/graphql-response+json, application/json";
      var response = await fetch(endpoint, { method: "POST", headers: headers, body: JSON.stringify(params) });
      var type = response.headers.get("content-type") || "";
      if (streaming && type.startsWith("text/event-stream")) return events(response);
      return response.json();
    };
  }

  var root = ReactDOM.createRoot(document.getElementById("graphiql"));
  function render() {
    root.render(
      React.createElement(GraphiQL, {
        fetcher: makeFetcher(),
        defaultTabs: EXAMPLES,
        defaultEditorToolsVisibility: "variables",
      })
    );
  }

  var field = document.getElementById("token");
  field.value = token();
  function keep() {
    if (field.value.trim() === token()) return;
    window.sessionStorage.setItem(KEY, field.value.trim());
    render(); // a new fetcher: GraphiQL loads the schema again with the token
  }
  field.addEventListener("change", keep);
  document.getElementById("bar").addEventListener("submit", function (event) {
    event.preventDefault(); // Enter in the field keeps the token; the page never navigates
    keep();
  });
  render();
})();
