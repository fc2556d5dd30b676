DROP TABLE rota.lined;
