"""The console's pages, one module each, with their JSON API twins and
actions: each read a plain function of a request and the console's servers
(rota.dashboard.data.Connections) returning JSON-ready data, each action one
of a request, its body, the servers and the actor; rota.dashboard.web makes
them HTTP handlers and rota.dashboard.app routes them."""
