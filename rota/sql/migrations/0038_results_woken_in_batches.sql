-- complete_keeping's result as 0037 first made it, which its file cannot replace.
DROP FUNCTION IF EXISTS rota.complete_keeping(uuid[], integer[], jsonb[], text[],
                                              double precision[]);
