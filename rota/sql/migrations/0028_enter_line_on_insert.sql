-- IF EXISTS: 0021 as first written made no rota.lined.
DROP TABLE IF EXISTS rota.lined;
