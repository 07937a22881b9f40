"""The router's HTTP only: the lean HTTP/1.1 server for the OpenAI routes, the aiohttp
app for everything else on the same loop, the admin routes, and how a process
serves and drains."""
