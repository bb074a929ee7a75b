"""The GraphiQL IDE's files, served at /graphiql/ by `threadloom.api.graphiql` (package data, no CDN).

graphiql.min.js/.css, react(-dom).production.min.js and their licences are copied unchanged from the npm
packages named in versions.json by scripts/vendor-graphiql; start.js and ide.css are ours (the token field,
the fetcher, the example operations).
"""
