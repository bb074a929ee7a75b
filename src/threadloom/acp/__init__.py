"""Threadloom as an Agent Client Protocol agent: `threadloom acp` speaks ACP on stdio to an editor.

The bridge is a client of a running Threadloom server, not part of it: it reaches the server only through
the public GraphQL API over one graphql-transport-ws socket, with the token it was given. An ACP session is
a Threadloom thread, a prompt is a run, and what the run does reaches the editor as session updates. So an
editor sees exactly what the token may see, and everything it does is in the thread's log like any other
client's work.
"""
